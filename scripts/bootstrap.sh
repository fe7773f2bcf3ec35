#!/usr/bin/env bash
# Set up everything `make demo` and `make test` need on a fresh Debian machine
# with Python >= 3.11 and Java 17: Debian packages (ZooKeeper, PostgreSQL), a
# virtual environment in .venv and the project installed into it with its dev
# extras.  Safe to run again: each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
DEBIAN_PACKAGES=(zookeeper postgresql python3-venv)

missing=()
for pkg in "${DEBIAN_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
    echo "bootstrap: installing Debian packages: ${missing[*]}"
    if [ "$(id -u)" -eq 0 ]; then
        SUDO=()
    elif sudo -n true 2>/dev/null; then
        SUDO=(sudo -n)
    else
        echo "bootstrap: these Debian packages are missing: ${missing[*]}" >&2
        echo "bootstrap: run 'sudo apt-get install -y ${missing[*]}' (or run this as root), then retry." >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    "${SUDO[@]}" apt-get update -q
    "${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

if ! command -v java >/dev/null 2>&1; then
    echo "bootstrap: java is not on PATH; ZooKeeper needs Java 17 (apt-get install openjdk-17-jre-headless)" >&2
    exit 1
fi

if [ ! -x .venv/bin/python ]; then
    echo "bootstrap: creating .venv with $($PYTHON --version)"
    "$PYTHON" -m venv .venv
fi

# Reinstall only when the dependency list changed.
stamp=.venv/.bootstrap-$(sha256sum pyproject.toml | cut -c1-16)
if [ ! -e "$stamp" ]; then
    echo "bootstrap: installing the project and its dev dependencies into .venv"
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e ".[dev,spark,broker,outbox]"
    rm -f .venv/.bootstrap-*
    touch "$stamp"
fi

# Delta Lake's jars, once, into ~/.cache/pyspark-jetstream/jars (with Maven, which honours
# ~/.m2/settings.xml mirrors); without Maven, Spark fetches them itself at the first session.
if ! .venv/bin/python -m pyspark_jetstream.spark.delta --fetch-jars >/dev/null; then
    echo "bootstrap: the Delta jars were not fetched with Maven; Spark will fetch them from Maven Central"
fi

# Kafka's broker and Spark's Kafka connector, bench/spark_bench.py's peer, once, into the same
# cache (subfolders); the benchmark fetches them itself when they are missing, and needs Maven.
if ! .venv/bin/python -m bench.kafka_peer --fetch-jars >/dev/null; then
    echo "bootstrap: the Kafka jars were not fetched with Maven; bench/spark_bench.py will try again"
fi
