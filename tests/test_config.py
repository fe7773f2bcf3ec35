"""The shipped configuration files load, and bad ones are refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker_node.config import ConfigError, load_log_config
from broker_node.log import FsyncPolicy, LogConfig

CONF = Path(__file__).resolve().parent.parent / "conf"


def test_shipped_log_config_documents_the_defaults():
    assert load_log_config(CONF / "log.toml") == LogConfig()


def test_log_config_values_are_applied(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[log]\nsegment_bytes = 1000\nfsync = "always"\nretention_age = 60\n')
    config = load_log_config(path)
    assert (config.segment_bytes, config.fsync, config.retention_age) == (1000, FsyncPolicy.ALWAYS, 60)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[log]\nsegmnt_bytes = 5\n", "unknown option.*segmnt_bytes.*known options: compaction"),
        ("[log]\nsegment_bytes = -5\n", "segment_bytes must be a positive number, got -5"),
        ("[log]\nsegment_bytes = '5'\n", "segment_bytes must be a positive number, got '5'"),
        ("[log]\ncompaction = 'yes'\n", "compaction must be true or false"),
        ('[log]\nfsync = "sometimes"\n', "fsync must be one of never, interval, always"),
        ("[log\n", "cannot read configuration"),
    ],
)
def test_bad_log_config_names_the_problem(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_log_config(path)
