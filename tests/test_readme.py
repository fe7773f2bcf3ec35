"""Every shell and Python block of README.md, docs/*.md and conf/*/README*, run as written.

A reader follows a document in order, so each document is one test: its blocks
run one after another in a directory laid out like the checkout (copies of
``conf/`` and ``scripts/``, and ``.venv`` linked to this environment), so what
they write (``data/``, ``outbox.db``, certificates) lands there, and git must
ignore it.  Shell blocks run line by line with ``bash``; a
command that runs until Ctrl-C (a broker, the outbox harvester) is started in
the background, waited for until it serves, and stopped with SIGINT at the end
of the document, which it must survive with exit status 0.  Python blocks run
as scripts with this environment's interpreter.

Only two things differ from the text: the ports (4222 and 9292, the defaults
of ``conf/``, become free ones, in the copied files and in the blocks, and
``JETSTREAM_NATS`` names the NATS port for commands that rely on the default)
and ``/tmp/`` (a directory of the test's own).  What a block needs that a
reader would have by then (a broker already running, a few orders to read) is
done here, out of the document (``BEFORE``, by document); so are the checks of
what each block did (``AFTER``).

Blocks run elsewhere are listed in ``ELSEWHERE`` with the test that runs them;
a block that is neither run here nor listed there fails the test.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pyspark_jetstream.client import SyncClient

pytestmark = pytest.mark.slow  # started first when the suite runs in parallel (tests/conftest.py)

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted(ROOT.glob("docs/*.md")), *sorted(ROOT.glob("conf/*/README*"))]
LANGUAGES = ("sh", "python")
BLOCK_TIMEOUT = 600
SERVE_TIMEOUT = 60.0

ELSEWHERE = {
    "make demo": "tests/test_demo.py runs the demo; `make test` is this suite, run by .ci/run",
    "pip wheel . --no-deps -w dist": "tests/test_packaging.py installs each line's wheel and extra",
    "make cluster": "tests/cluster/test_make_cluster.py runs docs/cluster.md's block against `make cluster`",
    "jetstream stream create clicks": "tests/cluster/test_reassignment.py runs docs/cluster.md's block",
}
"""Blocks run by another test, by their first command."""


@dataclass(frozen=True)
class Block:
    document: Path
    line: int
    language: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.document.relative_to(ROOT)}:{self.line}"

    @property
    def first_command(self) -> str:
        return next(line.strip() for line in self.text.splitlines() if line.strip() and line[0] != "#")


def blocks_of(document: Path) -> list[Block]:
    """The fenced blocks of ``document`` (indented ones too) in any language."""
    found = []
    for match in re.finditer(r"^( *)```(\w*)\n(.*?)^\1```$", document.read_text(), re.M | re.S):
        line = document.read_text()[: match.start()].count("\n") + 1
        found.append(Block(document, line, match[2], textwrap.dedent(match[3])))
    return found


def commands_of(text: str) -> Iterator[str]:
    """The command lines of a shell block (continuations joined; blank and comment lines left out)."""
    for line in re.sub(r"\\\n\s*", " ", text).splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            yield line


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Checkout:
    """A directory laid out like the repository, the ports the documents name mapped to free ones,
    and what the blocks started."""

    root: Path
    tmp: Path
    ports: dict[str, str]
    running: list[tuple[str, subprocess.Popen[str]]] = field(default_factory=list)

    @classmethod
    def make(cls, base: Path) -> Checkout:
        ports = {"4222": str(free_port()), "9292": str(free_port())}
        checkout = cls(base / "checkout", base / "tmp", ports)
        checkout.tmp.mkdir()
        for name in ("conf", "scripts"):
            shutil.copytree(ROOT / name, checkout.root / name, ignore=shutil.ignore_patterns("certs", "data"))
        (checkout.root / ".venv").symlink_to(Path(sys.prefix))  # `source .venv/bin/activate` works
        for path in (checkout.root / "conf").rglob("*.toml"):
            path.write_text(checkout.rewrite(path.read_text()))
        return checkout

    def rewrite(self, text: str) -> str:
        for port, free in self.ports.items():
            text = re.sub(rf"\b{port}\b", free, text)
        return text.replace("/tmp/", f"{self.tmp}/")

    @property
    def nats(self) -> str:
        return f"nats://127.0.0.1:{self.ports['4222']}"

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "JETSTREAM_NATS": self.nats,
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        }

    def run(self, block: Block) -> None:
        """Run ``block`` as written (ports and /tmp rewritten)."""
        text = self.rewrite(block.text)
        if block.language == "python":
            script = self.tmp / f"block-{block.line}.py"
            script.write_text(text)
            self.check(subprocess.run([sys.executable, str(script)], check=False, **self.options()), block)
            return
        for command in commands_of(text):
            if serving := SERVERS.get(_command_key(command)):
                if not any(running == command for running, _ in self.running):
                    self.start(command, serving, block)
                continue
            self.check(subprocess.run(["bash", "-c", command], check=False, **self.options()), block, command)

    def options(self) -> dict:
        return {
            "cwd": self.root,
            "env": self.env,
            "capture_output": True,
            "text": True,
            "timeout": BLOCK_TIMEOUT,
        }

    @staticmethod
    def check(done: subprocess.CompletedProcess[str], block: Block, command: str = "") -> None:
        assert done.returncode == 0, (
            f"{block.where} {command or block.first_command!r} exited {done.returncode}:\n"
            f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )

    def start(self, command: str, serving: Callable[[Checkout, str], bool], block: Block) -> None:
        """Start a command that runs until Ctrl-C, and wait until ``serving`` says it does."""
        log = self.tmp / f"server-{len(self.running)}.log"
        with log.open("w") as output:
            process = subprocess.Popen(
                ["bash", "-c", f"exec {command}"],
                cwd=self.root,
                env=self.env,
                stdout=output,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        self.running.append((command, process))
        deadline = time.monotonic() + SERVE_TIMEOUT
        while not serving(self, command):
            assert process.poll() is None, f"{block.where} {command!r} exited: {log.read_text()}"
            assert time.monotonic() < deadline, f"{block.where} {command!r} did not serve in time"
            time.sleep(0.1)

    def stop_all(self) -> list[str]:
        """Ctrl-C to everything started, newest first; what did not stop cleanly."""
        problems = []
        for command, process in reversed(self.running):
            process.send_signal(signal.SIGINT)
            try:
                code = process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                code = process.wait()
            if code != 0:
                problems.append(f"{command!r} exited {code} after Ctrl-C")
        self.running.clear()
        return problems

    def client(self) -> SyncClient:
        return SyncClient(nats_urls=self.nats, timeout=20)


def _command_key(command: str) -> str:
    words = shlex.split(command, comments=True)
    return " ".join(words[:3])


def _broker_serves(checkout: Checkout, command: str) -> bool:
    config = shlex.split(command, comments=True)
    path = checkout.root / config[config.index("--config") + 1]
    data_dir = tomllib.loads(path.read_text())["broker"]["data_dir"]
    return (checkout.root / data_dir / "broker.json").exists()


def _outbox_is_harvested(checkout: Checkout, command: str) -> bool:
    with sqlite3.connect(checkout.root / "outbox.db") as db:
        return db.execute("SELECT count(*) FROM outbox").fetchone()[0] == 0


SERVERS: dict[str, Callable[[Checkout, str], bool]] = {
    "jetstream broker start": _broker_serves,
    "jetstream outbox run": _outbox_is_harvested,
}
"""Commands that run until Ctrl-C, and how to tell that each does its job."""


# What a reader has by then, and what each block must have done: by the block's first command.
def _values(checkout: Checkout, stream: str) -> list[bytes]:
    with checkout.client() as client:
        partitions = len(client.describe_stream(stream).partitions)
        return [
            value.as_py()
            for partition in range(partitions)
            for value in client.fetch(stream, partition, max_records=1000).to_table().column("value")
        ]


def _orders_copied(checkout: Checkout) -> None:
    published = _values(checkout, "orders")
    assert len(published) == 5, published  # the README's five, published before the query
    assert sorted(_values(checkout, "orders-upper")) == sorted(v.upper() for v in published)


def _delta_table_written(checkout: Checkout) -> None:
    table = checkout.tmp / "tables" / "orders"
    assert (table / "_delta_log" / f"{0:020}.json").exists() and list(table.glob("*.parquet")), "no table"


def _event_in_outbox(checkout: Checkout) -> None:
    with sqlite3.connect(checkout.root / "outbox.db") as db:
        assert db.execute("SELECT count(*) FROM outbox").fetchone()[0] == 1


def _event_published(checkout: Checkout) -> None:
    with checkout.client() as client:
        values = [
            value
            for partition in range(3)
            for value in client.fetch("orders", partition, max_records=1000).to_table().column("value")
        ]
    assert any(v.as_py().startswith(b'{"order": ') for v in values), values


AFTER: dict[str, Callable[[Checkout], None]] = {
    '.option("stream", "orders-upper")': _orders_copied,
    'start("/tmp/tables/orders")': _delta_table_written,
    'db = sqlite3.connect("outbox.db")': _event_in_outbox,
    "jetstream outbox run --config conf/outbox.toml": _event_published,
}
"""What a reader has by then, or what the block must have done: by a line of the block, which
must be in exactly one block."""


def run_document(document: Path, base: Path) -> list[str]:
    """Run every block of ``document``, in order, after what ``BEFORE`` gives it."""
    checkout = Checkout.make(base)
    ran = []
    try:
        for before in BEFORE.get(str(document.relative_to(ROOT)), ()):
            before(checkout)
        for block in blocks_of(document):
            if block.language not in LANGUAGES:
                continue
            if any(block.first_command.startswith(command) for command in ELSEWHERE):
                continue
            checkout.run(block)
            for line, after in AFTER.items():
                if line in block.text:
                    after(checkout)
            ran.append(block.where)
    finally:
        problems = checkout.stop_all()
    assert not problems, problems
    written = [
        f"{p.name}/" if p.is_dir() else p.name
        for p in checkout.root.iterdir()
        if p.name not in ("conf", "scripts", ".venv")
    ]
    ignored = subprocess.run(
        ["git", "-C", str(ROOT), "check-ignore", *written], capture_output=True, text=True, check=False
    ).stdout.split()
    assert sorted(ignored) == sorted(written), f"written into the checkout, not ignored by git: {written}"
    return ran


def test_every_block_is_run_here_or_by_a_named_test():
    for document in DOCUMENTS:
        for block in blocks_of(document):
            if block.language in LANGUAGES:
                continue
            assert block.language in ("json", "toml", ""), f"{block.where}: a ```{block.language} block"
    listed = [b for d in DOCUMENTS for b in blocks_of(d) if b.language in LANGUAGES]
    for command in ELSEWHERE:
        assert any(b.first_command.startswith(command) for b in listed), f"no block starts {command!r}"
    for line in AFTER:
        holding = [b.where for b in listed if line in b.text]
        assert len(holding) == 1, f"{line!r} is in {holding or 'no block'}: its check would not run once"


def _start_the_broker(checkout: Checkout) -> None:
    """A page that needs a running broker says so and links to docs/broker.md: the broker its
    first block starts, started first."""
    page = ROOT / "docs" / "broker.md"
    block = page.read_text().split("```sh", 1)[1].split("```", 1)[0]
    (command,) = commands_of(checkout.rewrite(block))
    checkout.start(command, SERVERS[_command_key(command)], Block(page, 0, "sh", block))


def _orders_stream(checkout: Checkout) -> None:
    """The stream ``orders`` the README made (the pages that use it say how to make it)."""
    with checkout.client() as client:
        client.create_stream("orders", "orders", partitions=3)


def _orders_to_read(checkout: Checkout) -> None:
    """A few JSON orders in ``orders``, as the README's reader published them."""
    with checkout.client() as client:
        client.publish_batch("orders", [{"value": b'{"amount": %d}' % i} for i in range(5)], partition=1)


BEFORE: dict[str, tuple[Callable[[Checkout], None], ...]] = {
    "docs/spark.md": (_start_the_broker, _orders_stream, _orders_to_read),
    "docs/spark-latency.md": (_start_the_broker, _orders_stream, _orders_to_read),
    "docs/client.md": (_start_the_broker,),
    "docs/databricks.md": (_start_the_broker, _orders_stream, _orders_to_read),
    "docs/cli.md": (_start_the_broker,),
    "docs/outbox.md": (_start_the_broker, _orders_stream),
    "docs/operations.md": (_start_the_broker,),
}
"""What a reader of each document has by then, done before its first block."""

RUN = {
    "README.md": 5,
    "docs/broker.md": 2,
    "docs/cli.md": 1,
    "docs/client.md": 1,
    "docs/databricks.md": 1,
    "docs/internals.md": 1,
    "docs/operations.md": 1,
    "docs/outbox.md": 3,
    "docs/spark.md": 1,
    "docs/spark-latency.md": 1,
    "conf/secure/README.md": 5,
}
"""How many blocks each document runs here: a block lost from a document fails its test."""


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda d: str(d.relative_to(ROOT)))
def test_the_document_runs_as_written(document, tmp_path):
    ran = run_document(document, tmp_path)
    assert len(ran) == RUN.get(str(document.relative_to(ROOT)), 0), ran
