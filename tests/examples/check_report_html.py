#!/usr/bin/env python3
"""Checks that an upgrade report page renders as a person would see it,
without a browser: the HTML parses with its tags balanced, it loads nothing
(no script, stylesheet link, image or frame, so it reads the same offline),
every SVG is well-formed XML, and the loss plot holds one curve per release
whose points all lie inside the plot.

  check_report_html.py PAGE EXPECTED_CURVES
"""
import html.parser
import math
import re
import sys
import xml.etree.ElementTree as ET

VOID = {"meta", "br", "img", "link", "input", "hr", "col", "area", "base", "wbr", "source"}
SVG = "{http://www.w3.org/2000/svg}"


class Structure(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.stack, self.errors, self.loads = [], [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag in ("script", "link", "iframe", "img", "object", "embed"):
            self.loads.append(tag)
        for key in ("src", "href"):
            value = attrs.get(key) or ""
            if re.match(r"^(https?:)?//", value):
                self.loads.append(f"{tag} {key}={value}")
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in VOID:
            self.stack.pop()

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else 'nothing'}>")
            return
        self.stack.pop()


def main():
    page, expected = sys.argv[1], int(sys.argv[2])
    text = open(page, encoding="utf-8").read()
    if not text.lower().startswith("<!doctype html>"):
        raise SystemExit(f"{page}: no doctype")
    s = Structure()
    s.feed(text)
    s.close()
    if s.errors or s.stack:
        raise SystemExit(f"{page}: unbalanced tags: {s.errors[:3]} open {s.stack[:5]}")
    if s.loads:
        raise SystemExit(f"{page}: loads from elsewhere: {s.loads}")
    svgs = re.findall(r"<svg\b.*?</svg>", text, flags=re.S)
    if not svgs:
        raise SystemExit(f"{page}: no SVG")
    curves = 0
    for svg in svgs:
        root = ET.fromstring(svg)  # raises on malformed XML
        width, height = float(root.get("width")), float(root.get("height"))
        for line in root.iter(SVG + "polyline"):
            points = [tuple(map(float, p.split(","))) for p in line.get("points").split()]
            if len(points) < 25:
                raise SystemExit(f"{page}: a curve of {len(points)} points")
            for px, py in points:
                if not (math.isfinite(px) and math.isfinite(py) and 0 <= px <= width
                        and 0 <= py <= height):
                    raise SystemExit(f"{page}: point ({px}, {py}) outside {width}x{height}")
            curves += 1
    if curves != expected:
        raise SystemExit(f"{page}: {curves} curves, expected {expected}")
    print(f"{page}: renders: {len(svgs)} SVG, {curves} curves, nothing loaded from elsewhere")


if __name__ == "__main__":
    main()
