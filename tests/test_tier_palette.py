"""One tier palette: the JupyterLab panel (labextension/style/index.css) and the service's web
page (its style sheet and drawing script, service/web/static/) colour each tier as the notebook
QueueWidget does (widgets.TIER_COLOURS), as docs/notebook.md writes down."""

from __future__ import annotations

import re
from pathlib import Path

from jupyter_gpusched.notebook.widgets import TIER_COLOURS

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
