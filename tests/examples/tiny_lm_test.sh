#!/usr/bin/env bash
# examples/tiny_lm end to end on this build: it trains on 2 ranks and its
# loss falls well below the text's unigram entropy, its KV-cache decode
# agrees with a full forward (both checked by the program, exit 1
# otherwise); its record replays through keel::compat deterministically and
# within the band; a dropped attention mask falls outside the band (exit 1);
# and the upgrade report's page renders from its curves (a structural
# check of the HTML and SVG).
#
#   tests/examples/tiny_lm_test.sh TINY_LM WORK_DIR [STEPS]
set -euo pipefail
tiny_lm=$1
work=$2
steps=${3:-500}
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work"

"$tiny_lm" --steps "$steps" --record golden.safetensors --curve golden-curve.json
"$tiny_lm" --steps "$steps" --compare golden.safetensors --repeat 2 --json same.json \
  --html same.html --curve same-curve.json
set +e
"$tiny_lm" --steps "$steps" --compare golden.safetensors --repeat 1 --json regressed.json \
  --regression no_mask > regressed.txt 2>&1
code=$?
set -e
[ $code = 1 ] || { cat regressed.txt; echo "a dropped mask gave exit $code, not 1" >&2; exit 1; }
python3 - <<'PY'
import json
same = json.load(open("same.json"))["cases"][0]
bad = json.load(open("regressed.json"))["cases"][0]
assert same["status"] == "pass" and same["deterministic"], same
failed = {o["name"] for o in bad["outputs"] if not o["pass"]}
assert {"loss_curve_blocks", "eval_loss"} <= failed, failed
print("tiny_lm: same build passes; no_mask fails", sorted(failed))
PY
python3 "$here/../../scripts/upgrade_index.py" --out index.html --title "tiny_lm check" \
  --tiny-lm golden-curve.json --tiny-lm same-curve.json --compare same.json
python3 "$here/check_report_html.py" index.html 2
