"""The adapters' hook points against the manifest extracted from the real SGLang and vLLM
wheels (exporter/rankscope/rank/adapters/manifest.json, built by scripts/adapter-manifest.py), and
the check failing on a copy of the manifest with a hook target renamed."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest

from rankscope.rank.adapters import ADAPTERS
from rankscope.rank.adapters.manifest import MANIFEST_PATH, check_point, extract
from rankscope.rank.adapters.points import Adapter, HookPoint

MANIFEST = json.loads(MANIFEST_PATH.read_text(encoding="utf-8"))
BY_NAME = {a.framework: a for a in ADAPTERS}


def check(adapter: Adapter, manifest: dict[str, Any]) -> list[str]:
    """Every hook point of ``adapter`` against every version it declares checked; each
    problem names the version and the point. [] when all are present and compatible."""
    versions = manifest.get("frameworks", {}).get(adapter.framework, {})
    problems = []
    present: set[HookPoint] = set()
    for version in adapter.checked_versions:
        entry = versions.get(version)
        if entry is None:
            problems.append(f"{adapter.framework} {version}: not in the manifest")
            continue
        for point in adapter.points:
            found = check_point(point, entry["modules"].get(point.module))
            if not found:
                present.add(point)
            elif not point.optional:  # an optional one is read with a fallback where absent
                problems.extend(f"{adapter.framework} {version}: {p}" for p in found)
    missing = [p for p in adapter.points if p.optional and p not in present]
    return problems + [f"{adapter.framework}: {p.name} is in no checked version" for p in missing]


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda a: a.framework)
def test_every_hook_point_is_in_the_real_source_of_every_checked_version(adapter):
    assert check(adapter, MANIFEST) == []


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda a: a.framework)
def test_the_manifest_names_the_wheel_of_each_checked_version(adapter):
    versions = MANIFEST["frameworks"][adapter.framework]
    assert sorted(versions) == sorted(adapter.checked_versions)
    for version, entry in versions.items():
        assert entry["wheel"]["file"].startswith(f"{adapter.distribution}-{version}-")
        assert entry["wheel"]["file"].endswith(".whl")
        assert re.fullmatch(r"[0-9a-f]{64}", entry["wheel"]["sha256"])


def _mutated(tmp_path, edit):
    data = copy.deepcopy(MANIFEST)
    edit(data)
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(data))
    return json.loads(path.read_text(encoding="utf-8"))


def test_a_renamed_hook_target_fails_the_check(tmp_path):
    def rename(data):
        methods = data["frameworks"]["sglang"]["0.5.23"]["modules"][
            "sglang.srt.model_executor.model_runner"
        ]["classes"]["ModelRunner"]["methods"]
        methods["load_model_v2"] = methods.pop("load_model")

    problems = check(BY_NAME["sglang"], _mutated(tmp_path, rename))
    assert problems == [
        "sglang 0.5.23: sglang.srt.model_executor.model_runner:ModelRunner.load_model: "
        "ModelRunner defines no method load_model"
    ]


def test_a_renamed_parameter_the_adapter_reads_fails_the_check(tmp_path):
    def rename(data):
        method = data["frameworks"]["vllm"]["0.33.0"]["modules"]["vllm.v1.worker.gpu_worker"][
            "classes"
        ]["Worker"]["methods"]["initialize_from_config"]
        method["params"][0][0] = "config"

    problems = check(BY_NAME["vllm"], _mutated(tmp_path, rename))
    assert len(problems) == 1
    assert "Worker.initialize_from_config does not take 'kv_cache_config'" in problems[0]
    assert problems[0].startswith("vllm 0.33.0:")


def test_a_missing_module_or_version_fails_the_check(tmp_path):
    def drop(data):
        del data["frameworks"]["vllm"]["0.34.0"]["modules"][
            "vllm.distributed.device_communicators.cuda_communicator"
        ]
        del data["frameworks"]["sglang"]["0.5.22"]

    mutated = _mutated(tmp_path, drop)
    vllm_problems = check(BY_NAME["vllm"], mutated)
    assert vllm_problems and all(
        "cuda_communicator is not in the source" in p for p in vllm_problems
    )
    assert check(BY_NAME["sglang"], mutated) == ["sglang 0.5.22: not in the manifest"]


def test_an_optional_read_must_exist_in_some_checked_version(tmp_path):
    def drop(data):
        modules = data["frameworks"]["vllm"]["0.34.0"]["modules"]
        del modules["vllm.v1.worker.extensible_kv_cache"]

    assert check(BY_NAME["vllm"], _mutated(tmp_path, drop)) == [
        f"vllm: vllm.v1.worker.extensible_kv_cache:ExtensibleKVCache.{member} "
        "is in no checked version"
        for member in ("physical_bytes", "size")
    ]


SOURCE = """
import functools


class Runner:
    size: int

    def __init__(self, a, /, b, *args, c=1, **kw):
        self.pool = None
        self.cfg: int = 0
        (self.x, self.y) = (1, 2)

    @functools.cache
    def load(self, path, *, strict=False):
        pass

    @staticmethod
    def helper(v):
        pass

def get_group(name=None):
    pass

class Other:
    def load(self):
        pass
"""


def test_extract_reads_parameters_decorators_and_attributes_without_importing():
    got = extract(
        SOURCE,
        {"Runner": {"__init__", "load", "helper", "pool", "cfg", "x", "size", "gone"}},
        {"get_group", "missing"},
    )
    runner = got["classes"]["Runner"]
    assert runner["methods"]["__init__"]["params"] == [
        ["a", "positional_only"],
        ["b", "positional"],
        ["args", "var_positional"],
        ["c", "keyword_only"],
        ["kw", "var_keyword"],
    ]
    assert runner["methods"]["load"] == {
        "params": [["path", "positional"], ["strict", "keyword_only"]],
        "decorators": ["functools.cache"],
    }
    assert runner["methods"]["helper"]["decorators"] == ["staticmethod"]
    assert runner["attributes"] == ["cfg", "pool", "size", "x"]
    assert got["functions"] == {"get_group": [["name", "positional"]]}
    assert "Other" not in got["classes"]


def test_a_subscript_or_nested_store_on_self_defines_the_attribute():
    source = "class C:\n    def f(self):\n        self.table[0] = 1\n        self.n.k += 1\n"
    got = extract(source, {"C": {"table", "n"}}, set())
    assert got["classes"]["C"]["attributes"] == ["n", "table"]


def test_a_wrapped_static_method_fails_the_check():
    module = extract(SOURCE, {"Runner": {"helper"}}, set())
    problems = check_point(HookPoint("m", "Runner.helper", "wrap"), module)
    assert problems and "not a plain method" in problems[0]


def test_the_adapter_kind_round_trips_through_the_flight_reader(tmp_path):
    """An adapter line written as the adapters write it parses back into AdapterStatus; a
    bad field is named and nulled, and a line without a framework is malformed."""
    from rankscope.rank.writer import Recorder
    from rankscope.record import AdapterFailure, AdapterStatus, of_kind
    from rankscope.record.reader import parse_line, read_flight

    rec = Recorder(flight_dir=tmp_path)
    body = AdapterStatus(
        framework="vllm",
        status="not_attached",
        version="0.9.0",
        checked_versions=("0.33.0", "0.34.0"),
        failed=AdapterFailure(
            "vllm.v1.worker.gpu_worker:Worker.execute_model", "vllm 0.9.0 is not a checked version"
        ),
    )
    assert rec.write_record(body)
    (line,) = of_kind(read_flight(tmp_path).records, AdapterStatus)
    assert line.body == body
    raw = json.loads((tmp_path / next(p.name for p in tmp_path.iterdir())).read_text())
    assert raw["failed"] == {"hook": body.failed.hook, "why": body.failed.why}

    bad: list[str] = []
    raw["hooks"] = ["ok", 3]
    parsed = parse_line(json.dumps(raw).encode(), bad=bad)
    assert parsed.body.hooks == () and bad == ["adapter.hooks"]
    del raw["framework"]
    assert parse_line(json.dumps(raw).encode()) == "malformed"


def test_a_checked_version_is_the_release_whatever_its_local_build_label():
    from rankscope.rank.adapters.points import is_checked

    checked = ("0.33.0", "0.34.0")
    assert is_checked("0.34.0", checked)
    assert is_checked("0.34.0+cu130", checked)
    assert not is_checked("0.34.1", checked)
    assert not is_checked("0.34.0rc1", checked)
    assert not is_checked("0.34", checked)
    assert not is_checked(None, checked)
