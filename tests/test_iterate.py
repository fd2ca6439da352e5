"""Iterative search pieces (``nas.iterate``) that need no training: stage specs, relative
budgets carried to later stages as the original parent's absolute figures, search-space
values a later stage's parent cannot take, and bad input. The whole loop (score, search,
build, distill per stage, resumed) runs in ``tests/test_tiny_hybrid.py``."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from hwprofiles.errors import InputError  # noqa: E402
from nas import search  # noqa: E402
from nas.iterate import absolute_budgets, prune_space  # noqa: E402
from nas.spec import load_spec, parse_spec  # noqa: E402

pytestmark = pytest.mark.torch
SPEC = Path(__file__).resolve().parents[1] / "nas" / "examples" / "tiny-hybrid" / "spec.json"


def test_stages_parse_and_bad_stage_workloads_name_their_path():
    spec, _, _ = load_spec(SPEC)
    assert len(spec.stages) == 2 and spec.stages[1].budgets == spec.budgets
    data = json.loads(SPEC.read_text())
    data["stages"][0]["budgets"][0]["workload"] = "chat"
    with pytest.raises(InputError, match=r"stages\[0\]\.budgets\[0\]\.workload 'chat'"):
        parse_spec(data)
    data["stages"] = [{"budgets": []}]
    with pytest.raises(InputError, match="stages"):
        parse_spec(data)


def test_relative_budgets_become_the_original_parents_absolute_figures(tmp_path):
    spec, base, _ = load_spec(SPEC)
    problem = search.resolve(spec, base)
    absolute = absolute_budgets(problem, spec.budgets)
    assert absolute[0].min.endswith(" tok/s") and isinstance(absolute[1].max, float)
    pc = problem.parent.param_counts().total
    assert absolute[1].max == pytest.approx(0.5 * pc, rel=1e-12)  # "50%"
    # the same search with the absolute budgets chooses the same child under the same bounds
    data = json.loads(SPEC.read_text())
    data["budgets"] = [b.model_dump(exclude_none=True) for b in absolute]
    (tmp_path / "abs.json").write_text(json.dumps(data))
    rel = search.run(spec, base, tmp_path / "rel", progress=False).blueprints[0]
    s2, b2, _ = load_spec(tmp_path / "abs.json")
    ab = search.run(s2, b2, tmp_path / "abs", progress=False).blueprints[0]
    assert [c["child"] for c in ab.choices] == [c["child"] for c in rel.choices]
    for x, y in zip(rel.budgets, ab.budgets):
        assert y["bound"] == pytest.approx(x["bound"], rel=1e-9)
    # a later stage's parent (smaller) is bounded by the same absolute figures
    child = dict(data, parent=ab.child)
    (tmp_path / "child.json").write_text(json.dumps(child))
    s3, b3, _ = load_spec(tmp_path / "child.json")
    p3 = search.resolve(s3, b3)
    assert absolute_budgets(p3, s3.budgets) == s3.budgets  # absolute bounds stay as they are
    assert absolute_budgets(p3, spec.budgets)[1].max < absolute[1].max  # relative would move


def test_values_a_later_parent_cannot_take_are_left_out_and_reported():
    spec, _, _ = load_spec(SPEC)
    cfg = json.loads(SPEC.read_text())["parent"]
    space = json.loads(SPEC.read_text())["search_space"]
    kept, dropped = prune_space(cfg, space)
    assert kept == space and dropped == []
    no_attention = dict(cfg, hybrid_override_pattern=cfg["hybrid_override_pattern"]
                        .replace("*", "M"))
    kept, dropped = prune_space(no_attention, space)
    assert dropped == ["search_space.attention.kv_heads: 1"]
    assert kept["attention"]["kv_heads"] == [] and kept["mamba"] == space["mamba"]


def test_iterate_without_stages_is_one_line(tmp_path):
    from nas.cli import main as cli

    data = json.loads(SPEC.read_text())
    del data["stages"]
    (tmp_path / "spec.json").write_text(json.dumps(data))
    (tmp_path / "parent").mkdir()
    (tmp_path / "parent" / "config.json").write_text(json.dumps(data["parent"]))
    (tmp_path / "t.npy").write_bytes(b"")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = cli(["iterate", str(tmp_path / "spec.json"), "--parent", str(tmp_path / "parent"),
                  "--data", str(tmp_path / "t.npy"), "-o", str(tmp_path / "out"),
                  "--kd-tokens", "100"])
    assert rc == 2 and "lists no stages" in err.getvalue()
    assert err.getvalue().count("\n") == 1
