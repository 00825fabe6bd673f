"""One tier palette: the JupyterLab panel (labextension/style/index.css) and the service's web
page (its style sheet and drawing script, service/web/static/) colour each tier as the notebook
QueueWidget does (widget_lines.TIER_COLOURS), as docs/notebook.md writes down."""

from __future__ import annotations

import re
from pathlib import Path

from jupyter_gpusched.notebook.job import STATE_COLOURS
from jupyter_gpusched.notebook.widget_lines import TIER_COLOURS

CSS = Path(__file__).resolve().parent.parent / "labextension" / "style" / "index.css"
PAGE = Path(__file__).resolve().parent.parent / "jupyter_gpusched" / "service" / "web" / "static"
DOCS = Path(__file__).resolve().parent.parent / "docs" / "notebook.md"


def test_the_panel_and_the_widget_share_the_tier_palette():
    panel = {
        int(tier): colour.lower()
        for tier, colour in re.findall(
            r"\.jp-gpusched-t([123])\s*\{\s*background:\s*(#[0-9a-fA-F]{6})", CSS.read_text()
        )
    }
    assert panel == {tier: colour.lower() for tier, colour in TIER_COLOURS.items()}
    docs = DOCS.read_text().lower()
    assert all(colour.lower() in docs for colour in TIER_COLOURS.values())


def test_the_web_page_uses_the_same_tier_palette():
    expected = {tier: colour.lower() for tier, colour in TIER_COLOURS.items()}
    css = re.findall(
        r"^\.t([123])\s*\{\s*background:\s*(#[0-9a-fA-F]{6})",
        (PAGE / "page.css").read_text(),
        re.MULTILINE,
    )
    assert {int(t): c.lower() for t, c in css} == expected
    (script,) = re.findall(r"const TIER_COLOURS = \{([^}]*)\}", (PAGE / "draw.js").read_text())
    drawn = re.findall(r"([123]): '(#[0-9a-fA-F]{6})'", script)
    assert {int(t): c.lower() for t, c in drawn} == expected


def test_the_tier_colours_mean_tiers_only():
    """Nothing else on the page or in the panel (bars, lines, series, accents) wears a tier's
    colour, which a person would read as that tier: each appears once per palette rule."""
    colours = [c.lower() for c in TIER_COLOURS.values()]
    css_rules = {
        PAGE / "page.css": r"^\.t[123]\s*\{",
        CSS: r"^\.jp-gpusched-t[123]\s*\{",
    }
    for path, rule in css_rules.items():
        for line in path.read_text().lower().splitlines():
            if any(c in line for c in colours):
                assert re.match(rule, line), f"{path.name}: {line}"
    script = (PAGE / "draw.js").read_text().lower()
    for colour in colours:
        assert script.count(colour) == 1, f"draw.js uses {colour} beyond TIER_COLOURS"
    assert not set(colours) & {c.lower() for c in STATE_COLOURS.values()}  # the notebook's
