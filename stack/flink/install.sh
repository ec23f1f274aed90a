#!/usr/bin/env bash
# The Flink SQL analytics' own environment: PyFlink in a virtualenv of its own
# (~830 MB: Beam, pyarrow, pandas — kept out of the project's .venv) and the two SQL jars
# from Maven Central in a cache outside the repo. Idempotent: a second run checks and exits.
#
#   stack/flink/install.sh          install what is missing, verify the jars' SHA-256
#   stack/flink/install.sh where    print FLINK_PYTHON= and FLINK_JARS= (shell assignments)
#
# Environment: PYTHON (3.11, default python3), SESSIONSTREAM_FLINK_VENV (default
# ${XDG_CACHE_HOME:-~/.cache}/sessionstream/flink-venv-<version>: outside the repo, like the
# Kafka jars, so a fresh clone on the same machine reuses it), SESSIONSTREAM_FLINK_HOME (the
# jar cache, default ${XDG_DATA_HOME:-~/.local/share}/sessionstream/flink).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PYTHON="${PYTHON:-python3}"
HOME_DIR="${SESSIONSTREAM_FLINK_HOME:-${XDG_DATA_HOME:-$HOME/.local/share}/sessionstream/flink}"
JAR_DIR="$HOME_DIR/jars"

# PyPI's apache-flink 2.3.0 has no Kafka connector release yet (5.0.0-2.3 does not exist),
# so the Python package and the connector are pinned together.
PYFLINK_VERSION=2.2.1
VENV="${SESSIONSTREAM_FLINK_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/sessionstream/flink-venv-$PYFLINK_VERSION}"
MVN_DEP_PLUGIN=org.apache.maven.plugins:maven-dependency-plugin:3.8.1
# artifact coordinates | file | sha256. Pinned here because Maven Central serves no checksum
# for flink-sql-avro-confluent-registry 2.2.0 (mvn -C fails with "no checksums available").
JARS=(
  "org.apache.flink:flink-sql-connector-kafka:5.0.0-2.2|flink-sql-connector-kafka-5.0.0-2.2.jar|5605c691d11a501382c383fecba37a7a552467da5ab7ba904ef5d6f3d62c5616"
  "org.apache.flink:flink-sql-avro-confluent-registry:2.2.0|flink-sql-avro-confluent-registry-2.2.0.jar|dc331e14107ded6e07f5f77321aa06d8019aa9f33654d0658e49648409b5b80d"
)
STAMP="$VENV/.flink-installed-$PYFLINK_VERSION"

where() {
  local jars=() spec
  for spec in "${JARS[@]}"; do IFS='|' read -r _ file _ <<<"$spec"; jars+=("$JAR_DIR/$file"); done
  echo "FLINK_PYTHON=$VENV/bin/python"
  echo "FLINK_JARS=$(IFS=';'; echo "${jars[*]}")"
}

install_venv() {
  if [[ -f "$STAMP" && -x "$VENV/bin/python" ]]; then return; fi
  "$PYTHON" -c 'import sys; sys.exit(not ((3, 9) <= sys.version_info[:2] <= (3, 12)))' || {
    echo "error: PyFlink $PYFLINK_VERSION needs Python 3.9-3.12 ($PYTHON is $("$PYTHON" -V 2>&1)); set PYTHON=" >&2
    exit 1
  }
  command -v java >/dev/null || { echo "error: PyFlink needs a Java 11/17 runtime on PATH (Debian: apt-get install openjdk-17-jre-headless)" >&2; exit 1; }
  echo "flink: virtualenv $VENV with apache-flink==$PYFLINK_VERSION (log: $VENV/install.log)"
  [[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
  # The runner imports the repo's own codec (sessionstream/schemas/, fastavro) for its decode checks;
  # fastavro comes from the project's pins, sessionstream itself is put on sys.path by the runner.
  "$VENV/bin/python" -m pip install --disable-pip-version-check -q \
      "apache-flink==$PYFLINK_VERSION" >"$VENV/install.log" 2>&1 \
    || { tail -n 40 "$VENV/install.log" >&2; exit 1; }
  touch "$STAMP"
}

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

install_jars() {
  mkdir -p "$JAR_DIR"
  local spec coord file sha got
  for spec in "${JARS[@]}"; do
    IFS='|' read -r coord file sha <<<"$spec"
    if [[ ! -f "$JAR_DIR/$file" ]]; then
      command -v mvn >/dev/null || { echo "error: mvn is needed to fetch $coord (Debian: apt-get install maven)" >&2; exit 1; }
      echo "flink: fetching $coord"
      mvn -q -B "$MVN_DEP_PLUGIN:copy" -Dartifact="$coord" -DoutputDirectory="$JAR_DIR" \
        -Dmdep.overWriteReleases=true >"$HOME_DIR/mvn.log" 2>&1 \
        || { tail -n 30 "$HOME_DIR/mvn.log" >&2; exit 1; }
    fi
    got="$(sha_of "$JAR_DIR/$file")"
    if [[ "$got" != "$sha" ]]; then
      echo "error: $JAR_DIR/$file has sha256 $got, expected $sha" >&2
      rm -f "$JAR_DIR/$file"
      exit 1
    fi
  done
}

case "${1:-install}" in
  install) install_jars; install_venv; echo "flink: ready ($VENV, $JAR_DIR)" ;;
  where) where ;;
  *) echo "usage: $0 [install|where]" >&2; exit 2 ;;
esac
