"""The shipped configuration files load, and bad ones are refused by name."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from broker_node.config import BrokerConfig, ConfigError, load_broker_config, load_log_config
from broker_node.log import FsyncPolicy, LogConfig

CONF = Path(__file__).resolve().parent.parent / "conf"


def refusal(
    tmp_path: Path, text: str, load: Callable[[Path], object] = load_broker_config
) -> tuple[Path, str]:
    """The file holding ``text`` and the message with which ``load`` refuses it."""
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load(path)
    return path, str(info.value)


def test_shipped_log_config_documents_the_defaults():
    assert load_log_config(CONF / "log.toml") == LogConfig()


def test_log_config_values_are_applied(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[log]\nsegment_bytes = 4096\nfsync = "always"\nretention_age = 60\n')
    config = load_log_config(path)
    assert (config.segment_bytes, config.fsync, config.retention_age) == (4096, FsyncPolicy.ALWAYS, 60)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[log]\nsegmnt_bytes = 5\n", "unknown option.*segmnt_bytes.*known options: compaction"),
        (
            "[log]\nsegment_bytes = -5\n",
            r"segment_bytes must be an integer from 1024 \(1 KiB\) to 4294967296 \(4 GiB\), got -5",
        ),
        (
            "[log]\nsegment_bytes = '5'\n",
            r"segment_bytes must be an integer from 1024 \(1 KiB\) to 4294967296 \(4 GiB\), got '5'",
        ),
        ("[log]\ncompaction = 'yes'\n", "compaction must be true or false"),
        ('[log]\nfsync = "sometimes"\n', "fsync must be one of never, interval, always"),
        ("[log\n", "cannot read configuration"),
    ],
)
def test_bad_log_config_names_the_problem(tmp_path, text, message):
    _, error = refusal(tmp_path, text, load_log_config)
    assert re.search(message, error)


def test_shipped_broker_config_documents_the_defaults():
    assert load_broker_config(CONF / "broker.toml") == BrokerConfig()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "[broker]\nmaintenance_interval = 0\n",
            r"maintenance_interval must be .* from 0\.01 to 86400, got 0",
        ),
        ("[broker]\nmaintenance_interval = nan\n", r"maintenance_interval must be .*, got nan"),
        ("[broker]\nrack = 3\n", r"rack must be a name of at most 64 printable characters, got 3"),
        ('[broker]\nrack = "a\\nb"\n', r"rack must be a name .*, got 'a\\nb'"),
        (
            "[nats]\nembedded_port = 70000\n",
            r"embedded_port must be -1 \(a free port\) or 1 to 65535, got 70000",
        ),
        ("[nats]\nembedded_port = 0\n", r"embedded_port must be -1 \(a free port\) or 1 to 65535, got 0"),
        ("[nats]\nreconnect_wait = -1.0\n", r"reconnect_wait must be .* from 0\.01 to 3600, got -1\.0"),
        ("[nats]\nmax_reconnect_attempts = -2\n", r"max_reconnect_attempts must be -1 \(forever\) or 0 to"),
        ("[nats]\nservers = [4222]\n", r"servers must be NATS URLs"),
        ("[flight]\nport = 65536\n", r"port must be .* from 0 to 65535, got 65536"),
        ("[flight]\nport = -1\n", r"port must be .* from 0 to 65535, got -1"),
        ("[flight]\nmax_open_puts = 0\n", r"max_open_puts must be a positive integer up to 100000, got 0"),
        ("[ingest]\nmax_batch_messages = 0\n", r"max_batch_messages must be a positive integer up to"),
        ("[ingest]\nmax_batch_messages = 10000001\n", r"max_batch_messages must be a positive integer up to"),
        ("[ingest]\nmax_batch_bytes = 1\n", r"max_batch_bytes must be an integer from 1024 \(1 KiB\)"),
        ("[ingest]\nmax_delay = inf\n", r"max_delay must be .* from 0 to 60, got inf"),
        ("[log]\nsegment_bytes = 1\n", r"segment_bytes must be an integer from 1024 \(1 KiB\) to .*got 1$"),
        ("[log]\nmax_message_bytes = 67108865\n", r"max_message_bytes must be .* to 67108864 \(64 MiB\)"),
        ("[log]\nmax_batch_bytes = 2147483648\n", r"max_batch_bytes must be .* to 1073741824 \(1 GiB\)"),
        ("[log]\nfsync_interval = 0\n", r"fsync_interval must be .* from 0\.001 to 3600, got 0"),
        ("[log]\nsegment_max_age = 0.5\n", r"segment_max_age must be .* from 1 to"),
        ("[log]\nhigh_watermark_checkpoint_interval = inf\n", r"high_watermark_checkpoint_interval must be"),
        ("[log]\ntombstone_retention = nan\n", r"tombstone_retention must be .*, got nan"),
        ("[log]\nretention_messages = 9223372036854775807.0\n", r"retention_messages must be .*integer"),
    ],
)
def test_broker_options_are_bounded_and_errors_name_option_value_and_range(tmp_path, text, message):
    path, error = refusal(tmp_path, text)
    assert re.search(message, error)
    assert str(path) in error


def test_option_limits_are_inclusive(tmp_path):
    path = tmp_path / "edges.toml"
    path.write_text(
        "[broker]\nmaintenance_interval = 0.01\n"
        "[nats]\nembedded_port = -1\nmax_reconnect_attempts = -1\n"
        "[flight]\nport = 65535\n"
        "[ingest]\nmax_batch_messages = 1\nmax_batch_bytes = 1024\nmax_delay = 60\n"
        "[log]\nsegment_bytes = 1024\nmax_message_bytes = 67108864\nmax_batch_bytes = 1073741824\n"
        "fsync_interval = 0.001\nhigh_watermark_checkpoint_interval = 0\nretention_bytes = 0\n"
    )
    config = load_broker_config(path)
    assert (config.log.segment_bytes, config.flight.port, config.nats.embedded_port) == (1024, 65535, -1)


def test_the_cluster_configs_load_and_differ_only_where_they_must():
    configs = [load_broker_config(CONF / "cluster" / f"broker-{n}.toml") for n in (1, 2, 3)]
    assert [c.broker_id for c in configs] == ["broker-1", "broker-2", "broker-3"]
    assert len({c.data_dir for c in configs}) == 3 and len({c.flight.port for c in configs}) == 3
    assert {c.zookeeper.hosts for c in configs} == {"127.0.0.1:2181"}
    assert configs[0].zookeeper == configs[1].zookeeper == configs[2].zookeeper
    assert configs[0].replication == configs[1].replication


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[zookeeper]\nchroot = "no-slash"\n', "chroot must start with '/'"),
        ("[zookeeper]\nsession_timeout = 0.1\n", "session_timeout must be 1 to 120 seconds"),
        ("[zookeeper]\ncursor_replication_factor = 0\n", "cursor_replication_factor must be 1 to 16"),
        ("[replication]\nreplica_max_lag = 0\n", "replica_max_lag must be 0.1 to 3600 seconds"),
        ("[replication]\nfetch_max_bytes = 10\n", "fetch_max_bytes must be 1 KiB to 1 GiB"),
        ("[zookeeper]\nhost = 'x'\n", "unknown option.*host.*known options"),
    ],
)
def test_bad_cluster_settings_are_refused_by_name(tmp_path, text, message):
    _, error = refusal(tmp_path, text)
    assert re.search(message, error)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "[broker]\ndata_dri = 'x'\n",
            "unknown option(s) 'data_dri' (did you mean 'data_dir'?) in [broker] of {path}; "
            "known options: data_dir, id, maintenance_interval",
        ),
        ("[flight]\nprot = 1\n", "unknown option(s) 'prot' (did you mean 'port'?) in [flight] of {path}"),
        ("[flihgt]\nport = 1\n", "unknown table(s) 'flihgt' (did you mean 'flight'?) of {path}"),
        ("[broker]\nzzz = 1\n", "unknown option(s) 'zzz' in [broker] of {path}"),
    ],
)
def test_a_mistyped_option_or_table_names_the_closest_known_one(tmp_path, text, message):
    path, error = refusal(tmp_path, text)
    assert error.startswith(message.format(path=path))
