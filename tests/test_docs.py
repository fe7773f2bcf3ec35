"""The pages of docs/ build into a site, say what the code does, and link to what exists.

The site builds with ``mkdocs build --strict``: a broken link, a missing
anchor or a page left out of the nav fails it (and a test checks that it
would).  Links to the repository's own files (``/bench/RESULTS.md``,
``/notebooks/...``), which mkdocs leaves alone, are checked here.  The
broker's configuration reference is generated from ``broker_node/config.py``
and must be current; the Spark option tables must name every option the
source and sink parse, with the defaults the parser has.  The notebooks open
with what they show and how long they take, are linked from the pages they
illustrate, and carry no Spark noise in their outputs.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from pyspark_jetstream.spark import options as spark_options

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

_spec = importlib.util.spec_from_file_location("broker_config_doc", ROOT / "scripts" / "broker_config_doc.py")
assert _spec and _spec.loader
broker_config_doc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(broker_config_doc)


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_site_builds_strictly(tmp_path):
    done = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "spark" / "index.html").exists()


def test_a_broken_link_fails_the_build(tmp_path):
    shutil.copytree(DOCS, tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    with (tmp_path / "docs" / "cli.md").open("a") as page:
        page.write("\nSee [the missing page](missing.md).\n")
    done = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0 and "missing.md" in done.stdout + done.stderr, done.stdout + done.stderr


def _slug(heading: str) -> str:
    """An anchor as mkdocs and GitHub make it from a heading."""
    text = re.sub(r"[`*_]", "", heading).strip().lower()
    return re.sub(r"\s+", "-", re.sub(r"[^\w\s-]", "", text))


def _anchors(page: Path) -> set[str]:
    return {_slug(m[1]) for m in re.finditer(r"^#+ (.+)$", page.read_text(), re.M)}


def _links(page: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)  # not inside code blocks
    return re.findall(r"\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_to_files_of_the_repository_resolve(page):
    for link in _links(page):
        if link.startswith(("http://", "https://")):
            continue
        target, _, anchor = link.partition("#")
        if not target:
            path = page
        elif target.startswith("/"):
            path = ROOT / target.lstrip("/")
        else:
            path = (page.parent / target).resolve()
        assert path.exists(), f"{page.relative_to(ROOT)} links to {link}, which does not exist"
        if anchor and path.suffix == ".md":
            assert anchor in _anchors(path), f"{page.relative_to(ROOT)}: no heading for #{anchor} in {target}"


def test_the_readme_fits_on_a_few_screens_and_opens_with_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    first = readme.split("```sh\n", 1)[1].split("```", 1)[0]
    assert [line.split("#")[0].strip() for line in first.splitlines()] == ["make demo", "make test"]
    assert "source .venv/bin/activate" in readme
    for page in sorted(DOCS.glob("*.md")):
        if page.name != "index.md":
            assert f"(docs/{page.name})" in readme, f"the README's list of pages lacks docs/{page.name}"


def test_the_broker_configuration_reference_is_current():
    assert broker_config_doc.missing_docs() == [], "a configuration field has no docstring to show"
    page = (DOCS / "broker.md").read_text()
    assert broker_config_doc.rendered(page) == page, "run: python scripts/broker_config_doc.py"


def test_the_broker_reference_has_a_row_for_every_field():
    """A field added to a section shows up in the generated page (and fails the check above until
    it is regenerated)."""
    reference = broker_config_doc.reference()
    for name, cls in {"broker": broker_config_doc.BrokerConfig, **broker_config_doc._SECTIONS}.items():
        for field in dataclasses.fields(cls):
            if name == "broker" and field.name in broker_config_doc._SECTIONS:
                continue
            shown = "id" if field.name == "broker_id" else field.name
            assert f"| `{shown}` |" in reference.split(f"### `[{name}]`", 1)[1].split("### ", 1)[0]


def _option_rows() -> dict[str, list[str]]:
    """Each option of docs/spark.md's tables: its row's cells (default, Kafka's, meaning)."""
    rows: dict[str, list[str]] = {}
    for line in (DOCS / "spark.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) >= 3:
            name = cells[0].strip("`")
            if name in (*spark_options.SOURCE_OPTIONS, *spark_options.SINK_OPTIONS):
                rows.setdefault(name, cells[1:])
    return rows


def test_the_spark_tables_name_every_option_with_its_default():
    rows = _option_rows()
    parsed = set(spark_options.SOURCE_OPTIONS) | set(spark_options.SINK_OPTIONS)
    assert parsed - set(rows) == set(), "options without a row in docs/spark.md"
    assert all(cells[0] for cells in rows.values()), "a row without a default"
    page = (DOCS / "spark.md").read_text()
    for name in (*spark_options.SOURCE_ALIASES, *spark_options.SINK_ALIASES, *spark_options.KAFKA_ONLY):
        assert f"`{name}`" in page, f"Kafka's {name} is not named in docs/spark.md"


def test_the_spark_tables_defaults_are_the_parsers():
    rows = _option_rows()
    where = {"servers": "grpc://h:1", "stream": "s"}
    streaming = spark_options.parse_source_options(where, streaming=True)
    batch = spark_options.parse_source_options(where, streaming=False)
    sink = spark_options.parse_sink_options(where)
    assert (streaming.starting, batch.starting) == ("latest", "earliest")
    assert rows["startingOffsets"][0] == "`latest` for `readStream`, `earliest` for `read`"
    assert batch.ending == "latest" and rows["endingOffsets"][0] == "`latest`"
    assert streaming.max_trigger_delay == 15 * 60 and rows["maxTriggerDelay"][0].startswith("`15m`")
    assert rows["maxRecordsPerPartition"][0] == f"`{streaming.max_records_per_partition}`"
    assert rows["maxBatchBytes"][0].startswith(f"`{sink.max_batch_bytes}`")
    assert streaming.fail_on_data_loss and rows["failOnDataLoss"][0] == "`true`"
    assert streaming.read_mode == "tasks" and rows["readMode"][0] == "`tasks`"
    for flag in ("includeHeaders", "readFromReplicas", "pushFilters"):
        assert rows[flag][0] == "`false`"
    assert not (streaming.include_headers or streaming.read_from_replicas or batch.push_filters)
    assert (
        streaming.by_timestamp_strategy == "error"
        and rows["startingOffsetsByTimestampStrategy"][0] == "`error`"
    )
    assert (streaming.timeout, sink.timeout) == (30.0, 30.0) and rows["timeout"][0].startswith("`30` s")
    assert (
        spark_options.parse_source_options(
            {"nats": "nats://h:1", "stream": "s"}, streaming=True
        ).addresses.connect_timeout
        == 10.0
    )
    assert streaming.consumer_id.startswith("spark-") and rows["consumerId"][0].startswith("`spark-`")


def _notebook(path: Path) -> dict:
    return json.loads(path.read_text())


def _text(cell: dict) -> str:
    return "".join(cell["source"])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_each_notebook_opens_with_what_it_shows_and_how_long_it_takes(path):
    first = _notebook(path)["cells"][0]
    assert first["cell_type"] == "markdown"
    assert re.search(r"takes about \d+ (seconds|minutes?) (here|on)", _text(first)), _text(first)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_each_notebook_is_linked_from_a_page_it_illustrates(path):
    linking = [p.name for p in DOCS.glob("*.md") if f"(/notebooks/{path.name})" in p.read_text()]
    assert linking, f"no page of docs/ links to {path.name}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_outputs_carry_no_spark_noise_and_databricks_cells_say_flight(path):
    notebook = _notebook(path)
    noise = [
        line
        for cell in notebook["cells"]
        for output in cell.get("outputs", [])
        if output.get("name") == "stderr"
        for line in "".join(output["text"]).splitlines()
        if " WARN " in line or "log4j" in line
    ]
    assert not noise, noise[:3]
    (databricks,) = [c for c in notebook["cells"] if _text(c).startswith("## From Databricks")]
    assert "publishes through NATS" not in _text(databricks)
    assert "over Arrow Flight" in _text(databricks), _text(databricks)


@pytest.mark.parametrize(
    "path", [p for p in NOTEBOOKS if "JETSTREAM_NATS" in p.read_text()], ids=lambda p: p.stem
)
def test_notebooks_take_an_empty_jetstream_nats_as_unset(path):
    """(Notebook 07 starts its two sites itself: a failover between two clusters is its subject.)"""
    (setup,) = [
        c for c in _notebook(path)["cells"] if "JETSTREAM_NATS" in _text(c) and c["cell_type"] == "code"
    ]
    namespace: dict = {}
    line = next(line for line in _text(setup).splitlines() if "JETSTREAM_NATS" in line)
    saved = os.environ.get("JETSTREAM_NATS")
    os.environ["JETSTREAM_NATS"] = ""
    try:
        exec(line, {"os": os}, namespace)  # the cell's own line, as written
    finally:
        if saved is None:
            os.environ.pop("JETSTREAM_NATS")
        else:
            os.environ["JETSTREAM_NATS"] = saved
    assert namespace["nats_url"] is None


def test_the_notebook_front_end_the_readme_names_is_an_extra():
    readme = (ROOT / "README.md").read_text()
    extra = re.search(r'pip install -e "\.\[(\w+)\]"` then `\.venv/bin/jupyter lab notebooks/`', readme)
    assert extra, "the README says how to open the notebooks"
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(r.startswith("jupyterlab") for r in extras[extra[1]])
