"""What a person does in JupyterLab, for the journeys: open a notebook, run its cells, read the
outputs. The notebook is written into the user's server through its contents API (as the user,
with their token), then opened and run in the browser like any other."""

from __future__ import annotations

import json
import re

import requests
from journey import TIMEOUT_MS, WRITTEN, sync_api

expect = sync_api.expect if sync_api else None  # journey.MISSING says why not


def write_notebook(hub, user: str, path: str, cells: list[str]) -> None:
    notebook = {
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3"}},
        "cells": [
            {"cell_type": "code", "metadata": {}, "source": c, "outputs": []}
            | {"execution_count": None}
            for c in cells
        ],
    }
    response = requests.put(
        f"{hub.url}/user/{user}/api/contents/{path}",
        data=json.dumps({"type": "notebook", "format": "json", "content": notebook}),
        headers={"Authorization": f"token {hub.token(user)}"},
        timeout=30,
    )
    WRITTEN.add((user, path))  # removed when the module's hub stops (journey.demo)
    assert response.status_code in (200, 201), response.text


def write_file(hub, user: str, path: str, text: str | None) -> None:
    """A text file in the user's server (its folder must exist), or with ``text`` None a
    folder, through its contents API."""
    model = {"type": "directory"} if text is None else {"type": "file", "format": "text"}
    response = requests.put(
        f"{hub.url}/user/{user}/api/contents/{path}",
        data=json.dumps({**model, "content": text}),
        headers={"Authorization": f"token {hub.token(user)}"},
        timeout=30,
    )
    WRITTEN.add((user, path))
    assert response.status_code in (200, 201), response.text


def open_notebook(page, hub, user: str, path: str):
    if not getattr(page, "answers_select_kernel", False):
        # now and then JupyterLab asks which kernel to start although the notebook names one
        # (a clean-clone CI run met it over the admin's first notebook): a person clicks
        # Select; Playwright does whenever that dialog is in the way of an action
        dialog = page.locator(".jp-Dialog").filter(has_text="Select Kernel")
        page.add_locator_handler(
            dialog, lambda found: found.get_by_role("button", name="Select").click()
        )
        page.answers_select_kernel = True
    page.goto(f"{hub.url}/user/{user}/lab/tree/{path}")
    notebook = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
    expect(notebook).to_be_visible(timeout=TIMEOUT_MS)
    # the kernel is up when the toolbar's status says Idle
    expect(page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")).to_have_count(
        1, timeout=TIMEOUT_MS
    )
    return notebook


def run_cell(page, notebook, index: int, timeout_ms: int = TIMEOUT_MS):
    """Run cell ``index`` (Shift+Enter, as a person does) and wait until it finished; return it.
    A Shift+Enter in the first moments of a new kernel's connection can be lost (the prompt
    stays ``[ ]``, not even ``[*]``): then, like a person, select the cell and press again."""
    cell = notebook.locator(".jp-Cell").nth(index)
    prompt = cell.locator(".jp-InputArea-prompt")
    for _ in range(5):
        cell.locator(".jp-InputArea-editor").click()
        page.keyboard.press("Shift+Enter")
        try:
            expect(prompt).not_to_have_text(re.compile(r"^\[ \]:$"), timeout=5_000)
            break
        except AssertionError:
            continue
    expect(prompt).to_have_text(re.compile(r"\[\d+\]"), timeout=timeout_ms)
    return cell


def output_text(cell) -> str:
    return cell.locator(".jp-OutputArea").inner_text()
