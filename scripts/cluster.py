"""``make cluster``: a three-broker cluster on this machine, from conf/cluster/, until Ctrl-C.

Starts ZooKeeper (Debian's package, on 127.0.0.1:2181, data in
.cluster/zookeeper; no system service), one nats-server on 127.0.0.1:4222 and
the brokers of conf/cluster/broker-{1,2,3}.toml (Flight on 9301-9303), waits
until all serve, prints how to use them.  A broker that exits (a crash, a
``kill -9``) is reported and left down: the others go on and its partitions
fail over to them, as in a real cluster.  On Ctrl-C (or SIGTERM) it stops
the brokers gracefully -- each hands its leadership over first -- then NATS
and ZooKeeper.  Data stays in .cluster/ for the next run; ``make
cluster-clean`` removes it.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from broker_node.config import load_broker_config  # noqa: E402
from broker_node.nats_server import NatsServer  # noqa: E402
from broker_node.zookeeper_server import ZooKeeperServer, port_is_free  # noqa: E402

STATE = ROOT / ".cluster"
CONFIGS = sorted((ROOT / "conf" / "cluster").glob("broker-*.toml"))


def main(argv: list[str] | None = None) -> int:
    """Run the cluster until a stop signal; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--state-dir", type=Path, default=STATE, help="where data and logs go (default .cluster)"
    )
    args = parser.parse_args(argv)
    state = args.state_dir.resolve()
    configs = [load_broker_config(path) for path in CONFIGS]
    zookeeper_port = int(configs[0].zookeeper.hosts.rsplit(":", 1)[1])
    nats_port = int(configs[0].nats.servers[0].rsplit(":", 1)[1])
    ports = [zookeeper_port, nats_port, *(c.flight.port for c in configs)]
    busy = [p for p in ports if not port_is_free(p)]
    if busy:
        print(
            f"cluster: port(s) {', '.join(map(str, busy))} are in use: stop what holds them first (a "
            "cluster already running, or the broker of conf/broker.toml, which also uses 4222)",
            file=sys.stderr,
        )
        return 1
    state.mkdir(parents=True, exist_ok=True)
    # The configs name data directories under .cluster/, relative to where brokers run.
    workdir = state.parent if state.name == ".cluster" else state
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    signal.signal(signal.SIGINT, lambda *_: stop.append(True))
    zookeeper = ZooKeeperServer(port=zookeeper_port, data_dir=state / "zookeeper")
    nats = NatsServer(port=nats_port)
    brokers: list[subprocess.Popen[bytes]] = []
    try:
        zookeeper.start()
        nats.start()
        print(f"cluster: ZooKeeper at {zookeeper.hosts}, NATS at {nats.url}")
        for path, config in zip(CONFIGS, configs, strict=True):
            runtime = workdir / config.data_dir / "broker.json"
            runtime.unlink(missing_ok=True)
            log = open(state / f"{config.broker_id}.log", "ab")  # noqa: SIM115 - the child keeps it
            brokers.append(
                subprocess.Popen(
                    [sys.executable, "-m", "broker_node", "--config", str(path)],
                    cwd=workdir,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        for process, config in zip(brokers, configs, strict=True):
            runtime = workdir / config.data_dir / "broker.json"
            deadline = time.monotonic() + 60
            while not runtime.exists():
                if process.poll() is not None or time.monotonic() > deadline:
                    print(f"cluster: {config.broker_id} did not start; see {state / config.broker_id}.log")
                    return 1
                time.sleep(0.1)
            print(f"cluster: {config.broker_id} serves Flight at {json.loads(runtime.read_text())['flight']}")
        print(
            "cluster: up. Try:\n"
            f"  jetstream --nats {nats.url} stream create orders --subject orders --partitions 3 "
            "--replication-factor 3 --min-insync-replicas 2\n"
            f"  jetstream --nats {nats.url} cluster status\n"
            "Ctrl-C stops it."
        )
        reported: set[str] = set()
        while not stop:
            time.sleep(0.5)
            for process, path, config in zip(brokers, CONFIGS, configs, strict=True):
                if process.poll() is None or config.broker_id in reported:
                    continue
                # Left down: the others carry on and its partitions fail over to them, as they would
                # in a real cluster (stopping them all would hand leadership around for nothing).
                reported.add(config.broker_id)
                print(
                    f"cluster: {config.broker_id} exited ({_how(process.returncode)}); left down, its "
                    f"partitions fail over to the others (see {state / config.broker_id}.log). Start it "
                    f"again with: cd {workdir} && {sys.executable} -m broker_node --config {path}",
                    flush=True,
                )
    finally:
        print("cluster: stopping")
        for process in brokers:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in brokers:
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
        nats.stop()
        zookeeper.stop()
    return 0


def _how(returncode: int) -> str:
    """How a broker process ended, from its return code."""
    if returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    return f"exit code {returncode}"


if __name__ == "__main__":
    sys.exit(main())
