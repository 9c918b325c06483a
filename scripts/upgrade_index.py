#!/usr/bin/env python3
"""The upgrade report's front page: one self-contained HTML file (inline SVG,
no script, no network) with keel's canonical suite per release pair beside
the tiny language model trained on each release (examples/tiny_lm): its loss
curves in one plot, and per release the evaluation loss, tokens per second,
peak memory and what it generated.

  upgrade_index.py --out index.html [--title T]
      [--suite compare.json]...      keel-compat compare --json reports
      [--tiny-lm curve.json]...      tiny_lm --curve files, one per release
      [--compare tiny_lm.json]...    tiny_lm --compare --json reports
      [--serve load.json]...         keel-serve-load --json runs, one per release
      [--smollm2-texts texts.json]...    keel-generate --texts files, one per release
      [--smollm2-compare compare.json]... keel-generate --compare --json reports
      [--smollm2-bench bench.json]...    keel-generate --bench --json runs
"""
import argparse
import html
import json
import math
import os

COLOURS = ["#1b6ac9", "#d9480f", "#2b8a3e", "#862e9c", "#e67700", "#0b7285", "#c2255c"]


def esc(s):
    return html.escape(str(s), quote=True)


def curve_plot(curves):
    """Every release's loss curve in one SVG, with the unigram entropy."""
    width, height, left, bottom, top, right = 720, 320, 56, 36, 24, 150
    steps = max(len(c["loss_curve"]) for c in curves)
    values = [v for c in curves for v in c["loss_curve"]] + [c["unigram_entropy"] for c in curves]
    lo, hi = 0.0, max(values) * 1.05
    x = lambda i: left + (width - left - right) * i / max(1, steps - 1)
    y = lambda v: top + (height - top - bottom) * (1 - (v - lo) / (hi - lo))
    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
           f"viewBox='0 0 {width} {height}' font-family='sans-serif' font-size='11'>",
           f"<rect x='{left}' y='{top}' width='{width - left - right}' "
           f"height='{height - top - bottom}' fill='none' stroke='#999'/>"]
    for k in range(0, 6):
        v = lo + (hi - lo) * k / 5
        out.append(f"<text x='{left - 6}' y='{y(v) + 4:.1f}' text-anchor='end'>{v:.1f}</text>")
        out.append(f"<line x1='{left}' x2='{width - right}' y1='{y(v):.1f}' y2='{y(v):.1f}' "
                   "stroke='#eee'/>")
    for k in range(0, 6):
        i = (steps - 1) * k / 5
        out.append(f"<text x='{x(i):.1f}' y='{height - bottom + 14}' "
                   f"text-anchor='middle'>{int(i)}</text>")
    out.append(f"<text x='{(left + width - right) / 2}' y='{height - 6}' "
               "text-anchor='middle'>step</text>")
    out.append(f"<text x='14' y='{(top + height - bottom) / 2}' text-anchor='middle' "
               f"transform='rotate(-90 14 {(top + height - bottom) / 2})'>loss (nats/char)</text>")
    entropy = curves[0]["unigram_entropy"]
    out.append(f"<line x1='{left}' x2='{width - right}' y1='{y(entropy):.1f}' "
               f"y2='{y(entropy):.1f}' stroke='#666' stroke-dasharray='4 3'/>")
    out.append(f"<text x='{width - right + 4}' y='{y(entropy) + 4:.1f}'>unigram entropy</text>")
    for n, c in enumerate(curves):
        colour = COLOURS[n % len(COLOURS)]
        points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(c["loss_curve"]))
        out.append(f"<polyline fill='none' stroke='{colour}' stroke-width='1.2' "
                   f"points='{points}'><title>torch {esc(c['torch_version'])}</title></polyline>")
        ly = top + 14 + 16 * n
        out.append(f"<line x1='{width - right + 8}' x2='{width - right + 28}' y1='{ly - 4}' "
                   f"y2='{ly - 4}' stroke='{colour}' stroke-width='2'/>")
        out.append(f"<text x='{width - right + 32}' y='{ly}'>torch {esc(c['torch_version'])}</text>")
    out.append("</svg>")
    return "".join(out)


def suite_rows(paths):
    rows = []
    for path in paths:
        report = json.load(open(path))
        cases = report["cases"]
        count = lambda s: sum(c["status"] == s for c in cases)
        page = os.path.splitext(os.path.basename(path))[0] + ".html"
        rows.append("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
                    "<td>{}</td><td><a href='{}'>{}</a></td></tr>".format(
                        esc(report["golden"].get("torch_version", "?")),
                        esc(report["now"]["torch_version"]), esc(report["now"]["backend"]),
                        len(cases), count("pass"), count("skipped"),
                        len(cases) - count("pass") - count("skipped"), esc(page), esc(page)))
    return rows


def replay_cells(report):
    """The recorded-on and replayed-on cells of a keel::compat report's row."""
    return (f"<td>{esc(report['golden'].get('torch_version', '?'))}</td>"
            f"<td>{esc(report['now']['torch_version'])}</td>")


def output_cells(case):
    """Each output of a case: its largest difference against its tolerance."""
    return "<br>".join(f"{esc(o['name'])}: {o['max_abs']:.3g} / {o['tolerance']['atol']:.3g}"
                       f"{'' if o['pass'] else ' FAIL'}" for o in case["outputs"])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--title", default="keel upgrade report")
    p.add_argument("--suite", action="append", default=[])
    p.add_argument("--tiny-lm", action="append", default=[])
    p.add_argument("--compare", action="append", default=[])
    p.add_argument("--serve", action="append", default=[])
    p.add_argument("--smollm2-texts", action="append", default=[])
    p.add_argument("--smollm2-compare", action="append", default=[])
    p.add_argument("--smollm2-bench", action="append", default=[])
    a = p.parse_args()

    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(a.title)}</title>"
             "<style>body{font-family:sans-serif;margin:2em;max-width:72em}"
             "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;"
             "padding:3px 8px}.pass{background:#dfd}.fail,.error{background:#fdd}"
             "pre{white-space:pre-wrap;background:#f6f6f6;padding:6px}</style></head><body>",
             f"<h1>{esc(a.title)}</h1>"]
    if a.suite:
        parts.append("<h2>keel's canonical suite</h2><table><tr><th>recorded on</th>"
                     "<th>replayed on</th><th>adapter</th><th>cases</th><th>pass</th>"
                     "<th>skipped</th><th>fail</th><th>report</th></tr>")
        parts += suite_rows(a.suite)
        parts.append("</table>")
    if a.smollm2_texts:
        runs = [json.load(open(path)) for path in a.smollm2_texts]
        names = sorted(runs[0]["texts"])
        parts.append("<h2>SmolLM2-135M-Instruct on each release</h2><p>examples/models: the "
                     "published GGUF weights dequantized to float32, keel's tokenizer and its "
                     "Llama decoder (packed prefill, paged decode); 32 greedy tokens per prompt. "
                     "tests/models checks the same model against transformers.</p>"
                     "<table><tr><th>torch</th>" + "".join(f"<th>{esc(n)}</th>" for n in names) +
                     "</tr>")
        for r in runs:
            same = all(r["texts"].get(n) == runs[0]["texts"][n] for n in names)
            parts.append(f"<tr class='{'pass' if same else 'fail'}'><td>{esc(r['torch'])}</td>" +
                         "".join(f"<td><pre>{esc(r['texts'].get(n, 'missing'))}</pre></td>"
                                 for n in names) + "</tr>")
        parts.append("</table>")
        if all(r["texts"] == runs[0]["texts"] for r in runs):
            parts.append(f"<p>Every release generated the same texts ({len(runs)} releases).</p>")
        else:
            parts.append("<p><b>The texts differ between releases</b> (rows marked).</p>")
    if a.smollm2_compare:
        parts.append("<h3>Its logits and tokens replayed (keel::compat)</h3><table><tr>"
                     "<th>recorded on</th><th>replayed on</th><th>case</th><th>status</th>"
                     "<th>output: max |diff| / atol</th></tr>")
        for path in a.smollm2_compare:
            report = json.load(open(path))
            for c in report["cases"]:
                parts.append(f"<tr class='{esc(c['status'])}'>{replay_cells(report)}"
                             f"<td>{esc(c['id'])}</td><td>{esc(c['status'])}</td>"
                             f"<td>{output_cells(c)}</td></tr>")
        parts.append("</table>")
    if a.smollm2_bench:
        parts.append("<h3>Its speed and memory per release (one stream)</h3><table><tr>"
                     "<th>torch</th><th>dtype</th><th>threads</th><th>prefill 128 tok/s</th>"
                     "<th>prefill 1024 tok/s</th><th>decode ctx 128 tok/s</th>"
                     "<th>decode ctx 2048 tok/s</th><th>peak MiB</th></tr>")
        for path in a.smollm2_bench:
            b = json.load(open(path))
            parts.append(f"<tr><td>{esc(b['torch'])}</td><td>{esc(b['dtype'])}</td>"
                         f"<td>{b['threads']:.0f}</td>"
                         f"<td>{b['prefill_128_tokens_per_s']:.0f}</td>"
                         f"<td>{b['prefill_1024_tokens_per_s']:.0f}</td>"
                         f"<td>{b['decode_ctx128_tokens_per_s']:.1f}</td>"
                         f"<td>{b['decode_ctx2048_tokens_per_s']:.1f}</td>"
                         f"<td>{b['peak_rss_mib']:.0f}</td></tr>")
        parts.append("</table>")
    if a.tiny_lm:
        curves = [json.load(open(path)) for path in a.tiny_lm]
        for c in curves:
            if not c["loss_curve"] or not all(math.isfinite(v) for v in c["loss_curve"]):
                raise SystemExit(f"upgrade_index: a curve of torch {c['torch_version']} is empty "
                                 "or not finite")
        parts.append("<h2>A small language model trained on each release</h2>"
                     "<p>examples/tiny_lm: a character-level transformer trained with "
                     "keel::attention, keel::linear_cross_entropy and keel::comm on 2 ranks "
                     "(docs/tiny-lm.md).</p>")
        parts.append(curve_plot(curves))
        if len(curves) > 1 and all(c["loss_curve"] == curves[0]["loss_curve"] for c in curves):
            parts.append("<p>The curves coincide: every release trained to bitwise the same "
                         "losses, so the last one drawn hides the others.</p>")
        parts.append("<table><tr><th>torch</th><th>final train loss</th><th>eval loss</th>"
                     "<th>unigram entropy</th><th>tokens/s</th></tr>")
        for c in curves:
            parts.append(f"<tr><td>{esc(c['torch_version'])}</td><td>{c['loss_curve'][-1]:.4f}"
                         f"</td><td>{c['eval_loss']:.4f}</td><td>{c['unigram_entropy']:.4f}</td>"
                         f"<td>{c['tokens_per_s']:.0f}</td></tr>")
        parts.append("</table>")
        for c in curves:
            parts.append(f"<p>Generated on torch {esc(c['torch_version'])}:</p>"
                         f"<pre>{esc(c['generated'])}</pre>")
    if a.compare:
        parts.append("<h3>Its record replayed (keel::compat)</h3><table><tr><th>recorded on</th>"
                     "<th>replayed on</th><th>status</th><th>output: max |diff| / atol</th>"
                     "<th>ms golden / now</th><th>peak MiB golden / now</th></tr>")
        for path in a.compare:
            report = json.load(open(path))
            for c in report["cases"]:
                parts.append(
                    f"<tr class='{esc(c['status'])}'>{replay_cells(report)}"
                    f"<td>{esc(c['status'])}</td><td>{output_cells(c)}</td>"
                    f"<td>{c['forward_ms']['golden']:.0f} / {c['forward_ms']['now']:.0f}</td><td>"
                    f"{c['peak_bytes']['golden'] / 2**20:.1f} / "
                    f"{c['peak_bytes']['now'] / 2**20:.1f}</td></tr>")
        parts.append("</table>")
    if a.serve:
        parts.append("<h2>The model served on each release</h2><p>examples/serve: keel-serve "
                     "under keel-serve-load's seeded streaming requests, N closed-loop clients, "
                     "a fresh server per cell (docs/serving.md).</p><table><tr><th>torch</th>"
                     "<th>batching</th><th>clients</th><th>done</th><th>tokens/s</th>"
                     "<th>TTFT p50 / p99 ms</th><th>TPOT p50 / p99 ms</th><th>peak MiB</th>"
                     "<th>pages</th></tr>")
        for path in a.serve:
            run = json.load(open(path))
            for c in run["cells"]:
                ok = c.get("done") == c["requests"] and c.get("pages_returned")
                if "ttft_ms" not in c:
                    parts.append(f"<tr class='fail'><td>{esc(run.get('torch', '?'))}</td>"
                                 f"<td>{esc(c['mode'])}</td><td>{c['clients']}</td>"
                                 f"<td colspan='6'>{esc(c.get('first_error', 'failed'))}</td></tr>")
                    continue
                parts.append(
                    f"<tr class='{'pass' if ok else 'fail'}'><td>{esc(run.get('torch', '?'))}</td>"
                    f"<td>{esc(c['mode'])}</td><td>{c['clients']}</td>"
                    f"<td>{c['done']} of {c['requests']}</td>"
                    f"<td>{c['output_tokens_per_s']:.0f}</td>"
                    f"<td>{c['ttft_ms']['p50']:.1f} / {c['ttft_ms']['p99']:.1f}</td>"
                    f"<td>{c['tpot_ms']['p50']:.2f} / {c['tpot_ms']['p99']:.2f}</td>"
                    f"<td>{c['peak_mib']:.0f}</td>"
                    f"<td>{'back' if c['pages_returned'] else 'LOST'}</td></tr>")
        parts.append("</table>")
    parts.append("</body></html>\n")
    with open(a.out, "w") as f:
        f.write("".join(parts))


if __name__ == "__main__":
    main()
