"""The documentation a user reads: docs/API.md covers the public API, and the executed notebook
pages in docs/executed/ show every image in any clone.

- every name in `ropelib.__all__` and every public function of the drop-in modules (ropelib.te,
  ropelib.hf, ropelib.hf_patch) is documented in docs/API.md (a heading or a `code` span that
  starts with it);
- docs/API.md is a reference, not a log: no heading "Additions made while building";
- every `<img src>` of docs/executed/*.html is embedded (data:) or a file inside the checkout;
- the renderer (benchmarks/run_notebooks.py) writes pages whose images hold in a clone;
- docs/API.md's examples run;
- an error read as documentation: `ropelib.hf.apply_rotary_pos_emb` given [batch, seq, heads,
  head_dim] tensors says it expects Hugging Face's [batch, heads, seq, head_dim] and how to pass
  them.
"""
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from loading import load_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
API_MD = ROOT / "docs" / "API.md"
EXECUTED = ROOT / "docs" / "executed"


# ---------------------------------------------------------------------------------------------
# docs/API.md

def _api_md() -> str:
    return API_MD.read_text(encoding="utf-8")


def _documented(name: str, text: str) -> bool:
    """`name` (or `module.name`) as a heading's word or at the start of a `code` span."""
    qualified = r"(?:[A-Za-z_][A-Za-z0-9_]*\.)*" + re.escape(name) + r"(?![A-Za-z0-9_])"
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)     # examples do not count
    if re.search(r"^#+ .*?\b" + re.escape(name) + r"\b", text, re.M):
        return True
    return any(re.match(qualified, span) for span in re.findall(r"`([^`]+)`", text))


def _public_names():
    import ropelib
    from ropelib import hf, hf_patch, te
    names = [(n, "ropelib") for n in ropelib.__all__]
    names += [(n, "ropelib.te") for n in te.__all__]
    names += [(n, "ropelib.hf") for n in hf.__all__]
    names += [(n, "ropelib.hf_patch") for n in ("patch_hf_rope", "patch_llama", "PatchStats")]
    return names


def test_every_public_name_is_documented_in_api_md():
    text = _api_md()
    missing = [f"{module}.{name}" for name, module in _public_names() if not _documented(name, text)]
    assert not missing, f"docs/API.md does not document: {missing}"


def test_the_documented_check_finds_what_it_should():
    text = "## Core RoPE\n- `ropelib.apply_rope(x, freqs)` rotates\n- `apply_rope_qk(q, k)`\n"
    assert _documented("apply_rope", text) and _documented("apply_rope_qk", text)
    assert not _documented("rope", text)             # a word inside another name does not count
    assert not _documented("rope_freqs", text)
    assert _documented("Core", text)                 # a heading's word


def test_api_md_has_no_heading_of_the_building_log():
    headings = re.findall(r"^#+ (.+)$", _api_md(), re.M)
    assert not [h for h in headings if "Additions made while building" in h], headings


def test_api_md_links_to_its_own_sections():
    """The contents list and the cross-references land on a heading (GitHub's anchors)."""
    text = re.sub(r"^```.*?^```", "", _api_md(), flags=re.M | re.S)
    anchors = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
               for h in re.findall(r"^#+ (.+)$", text, re.M)}
    links = re.findall(r"\]\(#([^)]+)\)", text)
    assert links and not [a for a in links if a not in anchors], sorted(set(links) - anchors)


def test_api_md_states_what_users_ask_for():
    text = _api_md()
    # apply_rope's position_ids shapes, M-RoPE's section unit, the KV cache's index types
    assert "position_ids" in text and "[B, S]" in text and "[T]" in text
    assert re.search(r"section.{0,200}frequency pairs", text, re.S)
    assert re.search(r"cache_seqlens.{0,300}int32", text, re.S)
    # start_positions with context parallelism: supported, with TE's semantics and table size
    assert "max(start_positions) + seq_len * cp_size" in text


_RUN_EXAMPLES = r"""
import importlib.util, json, sys, traceback
blocks = json.loads(sys.argv[1])
preamble, examples = blocks[0], blocks[1:]
base = {}
exec(compile(preamble, "API.md preamble", "exec"), base)
failed, skipped = [], []
for i, block in enumerate(examples, 1):
    if "transformers" in block and importlib.util.find_spec("transformers") is None:
        skipped.append(i)
        continue
    try:
        exec(compile(block, f"API.md example {i}", "exec"), dict(base))
    except Exception:
        failed.append(f"example {i} ({block.strip().splitlines()[0]}):\n{traceback.format_exc(limit=4)}")
print(json.dumps({"ran": len(examples) - len(skipped), "skipped": skipped, "failed": failed}))
"""


@pytest.mark.slow
def test_api_md_examples_run(tmp_path):
    """Every ```python example of docs/API.md runs (each on its own after the preamble)."""
    import json
    import os
    import subprocess
    import sys
    blocks = re.findall(r"^```python\n(.*?)^```", _api_md(), re.M | re.S)
    assert len(blocks) >= 10 and "TRITON_INTERPRET" in blocks[0], "the first example is the preamble"
    out = subprocess.run([sys.executable, "-c", _RUN_EXAMPLES, json.dumps(blocks)], cwd=tmp_path,
                         env=dict(os.environ), capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert not report["failed"], "docs/API.md examples fail:\n" + "\n".join(report["failed"])
    assert report["ran"] >= len(blocks) - 2


# ---------------------------------------------------------------------------------------------
# docs/executed/*.html: images

class _Images(HTMLParser):
    def __init__(self):
        super().__init__()
        self.srcs = []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.srcs.append(dict(attrs).get("src") or "")


def _image_sources(page: Path) -> list:
    parser = _Images()
    parser.feed(page.read_text(encoding="utf-8"))
    return parser.srcs


def _broken(page: Path, root: Path = ROOT) -> list:
    """Sources that are neither data: URIs nor files inside `root` reached from the page."""
    broken = []
    for src in _image_sources(page):
        if src.startswith("data:"):
            continue
        if not src or re.match(r"^[a-z][a-z0-9+.-]*:|^/", src, re.I):   # URL or absolute path
            broken.append(src)
            continue
        target = (page.parent / src).resolve()
        if not (target.is_relative_to(root.resolve()) and target.is_file()):
            broken.append(src)
    return broken


PAGES = sorted(EXECUTED.glob("*.html"))


def test_there_are_executed_pages():
    assert len(PAGES) >= 12, [p.name for p in PAGES]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_image_of_an_executed_page_shows_in_a_clone(page):
    broken = _broken(page)
    assert not broken, f"{page.name}: images that are neither embedded nor files in the checkout: {broken}"


def test_the_image_check_catches_a_path_of_another_machine(tmp_path):
    docs = tmp_path / "docs" / "executed"
    docs.mkdir(parents=True)
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "a.png").write_bytes(b"\x89PNG")
    page = docs / "p.html"
    page.write_text('<img src="../../figures/a.png"/><img src="data:image/png;base64,AA"/>'
                    '<img src="../../work/main/figures/a.png"/><img src="/work/main/figures/a.png"/>'
                    '<img src="../../figures/missing.png"/>')
    assert _broken(page, tmp_path) == ["../../work/main/figures/a.png", "/work/main/figures/a.png",
                                       "../../figures/missing.png"]


# ---------------------------------------------------------------------------------------------
# the renderer: benchmarks/run_notebooks.py

@pytest.fixture(scope="module")
def renderer():
    module = load_file("run_notebooks", ROOT / "benchmarks" / "run_notebooks.py")
    return module


def test_renderer_links_figures_relative_to_pages_in_the_checkout(renderer):
    md = "![the split](../figures/11-dual-chunk-split.png) and ![fp8](../figures/11-fp8-scale.png)"
    assert renderer.figure_links(md, EXECUTED) == (
        "![the split](../../figures/11-dual-chunk-split.png) and ![fp8](../../figures/11-fp8-scale.png)")


def test_renderer_embeds_figures_in_pages_outside_the_checkout(renderer, tmp_path):
    out = renderer.figure_links("![fp8](../figures/11-fp8-scale.png)", tmp_path / "html")
    assert out.startswith("![fp8](data:image/png;base64,") and "/work/" not in out


def test_rendered_page_outside_the_checkout_has_no_broken_image(renderer, tmp_path):
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("nbconvert")
    executed, to = tmp_path / "executed", tmp_path / "html"
    executed.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("![The dual-chunk\nsplit](../figures/11-dual-chunk-split.png)")]
    nb.metadata["ropelib_executed"] = {"gpu": "no GPU", "status": "ok"}
    nbformat.write(nb, executed / "11-rope-at-scale.ipynb")
    assert renderer.to_html(executed, to) == 0
    page = to / "11-rope-at-scale.html"
    srcs = _image_sources(page)
    assert len(srcs) == 1 and srcs[0].startswith("data:image/png;base64,"), [s[:60] for s in srcs]
    assert renderer.broken_images(page) == []


def test_renderer_check_flags_a_link_that_leaves_the_checkout(renderer, tmp_path):
    page = tmp_path / "p.html"
    page.write_text('<p><img alt="x" src="../../work/main/figures/11-fp8-scale.png"/></p>')
    assert renderer.broken_images(page) == ["../../work/main/figures/11-fp8-scale.png"]


# ---------------------------------------------------------------------------------------------
# What an error tells a user: ropelib.hf given the other layout

def test_hf_drop_in_says_which_layout_it_expects():
    """Hugging Face's apply_rotary_pos_emb takes q, k as [batch, heads, seq, head_dim]
    (unsqueeze_dim=1). Given [batch, seq, heads, head_dim] tensors, the error says so and how
    to pass them."""
    import torch
    import ropelib
    from ropelib import hf
    device = ropelib.default_device()
    cos, sin = ropelib.rope_cos_sin(8, 64, device=device)
    q = torch.randn(2, 8, 4, 64, device=device)      # bshd: 8 tokens, 4 heads
    k = torch.randn(2, 8, 2, 64, device=device)      # GQA: 2 heads
    for k_in in (k, torch.randn(2, 8, 4, 64, device=device)):   # q/k disagree; cos/sin disagree
        with pytest.raises(ValueError) as e:
            hf.apply_rotary_pos_emb(q, k_in, cos[None], sin[None])
        message = str(e.value)
        assert "[batch, heads, seq, head_dim]" in message and "unsqueeze_dim=1" in message, message
        assert "q.transpose(1, 2)" in message and "unsqueeze_dim=2" in message, message
    # both ways out the message names work, and agree
    q_t, k_t = hf.apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos[None], sin[None])
    q_2, k_2 = hf.apply_rotary_pos_emb(q, k, cos[None], sin[None], unsqueeze_dim=2)
    torch.testing.assert_close(q_t.transpose(1, 2), q_2, rtol=0, atol=0)
    torch.testing.assert_close(k_t.transpose(1, 2), k_2, rtol=0, atol=0)
    # and the other way round: HF's layout passed with unsqueeze_dim=2
    with pytest.raises(ValueError, match=r"unsqueeze_dim=2 expects q, k = \[batch, seq, heads, head_dim\]"):
        hf.apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos[None], sin[None],
                                unsqueeze_dim=2)
