"""Plugin registration: off by default, the pipelines it re-registers, config resolution,
post-import hooks, the shipped single-GPU deploy files, the container recipe."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from factory import import_pipeline_registry, stage_configs_for

pytestmark = pytest.mark.vllm

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PLUGIN_DIR = ROOT / "runtime" / "engine" / "vllm_omni"
AR = "horizonserve.runtime.engine.vllm_omni.scheduler.ar_scheduler"
GEN = "horizonserve.runtime.engine.vllm_omni.scheduler.generation_scheduler"

# Loads the plugins the way a vLLM-Omni process does, then reports what changed.
PROBE = textwrap.dedent(
    """
    import json, os, sys
    sys.path.insert(0, sys.argv[1])
    from factory import import_pipeline_registry, stage_configs_for
    from vllm_omni.plugins import load_omni_general_plugins
    load_omni_general_plugins()  # vLLM's group first, then vLLM-Omni's: both name the plugin
    registry = import_pipeline_registry()
    from horizonserve.runtime.engine.vllm_omni import hooks, plugin, shared
    out = {
        "registered": plugin.is_registered(),
        "run": os.environ.get("HORIZONSERVE_VLLM_RUN"),
        "resolved": json.loads(os.environ.get("HORIZONSERVE_VLLM_RESOLVED_CONFIG", "null")),
        "pending": sorted(hooks.pending()),
        "shm": sorted(os.listdir(os.environ["HORIZONSERVE_SHM_DIR"])),
    }
    for key in ("qwen2_5_omni", "mimo_audio", "bagel", "bagel_think"):
        out[key] = [s.scheduler_cls for s in registry.resolve_pipeline_config(key).stages]
    qwen = registry.resolve_pipeline_config("qwen2_5_omni")
    stages = stage_configs_for(qwen)
    out["stage_configs"] = [s.scheduler_cls for s in stages]
    out["deploy"] = qwen.default_deploy_config_name
    out["devices"] = [str(s.yaml_runtime.get("devices")) for s in stages]
    print("RESULT" + json.dumps(out))
    """
)


def probe(tmp_path: Path, **env: str) -> dict:
    base = {k: v for k, v in os.environ.items() if not k.startswith("HORIZONSERVE_")}
    base.update(HORIZONSERVE_SHM_DIR=str(tmp_path), **env)
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(HERE)],
        env=base,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT") :])


def test_installed_but_off_changes_nothing(tmp_path):
    out = probe(tmp_path)
    assert not out["registered"] and out["run"] is None and out["pending"] == []
    assert out["qwen2_5_omni"] == [None, None, None]
    assert out["shm"] == []


def test_on_reregisters_the_target_pipelines(tmp_path):
    out = probe(tmp_path, HORIZONSERVE_VLLM="1", HORIZONSERVE_PIPELINE="qwen2_5_omni")
    assert out["registered"] and out["run"]
    assert out["qwen2_5_omni"] == [AR, AR, GEN]
    assert out["mimo_audio"] == [AR, GEN]
    assert out["bagel"] == [AR, None] and out["bagel_think"] == [AR, None]  # DiT: no scheduler
    assert out["stage_configs"] == [AR, AR, GEN]  # what the stage processes are given
    # Without --deploy-config, the single-GPU deploy file is the default now.
    assert out["deploy"] == str(PLUGIN_DIR / "deploy" / "qwen2_5_omni.yaml")
    assert out["devices"] == ["0", "0", "0"]
    assert out["resolved"]["pipeline"] == "qwen2_5_omni"  # exported to the children
    run = out["run"]
    assert out["shm"] == sorted(
        f"horizonserve-vllm-{name}-{run}" for name in ("control", "requests", "answers")
    )
    # Patches still waiting for their modules in this process (the API / worker ones).
    assert "vllm_omni.entrypoints.openai.serving_chat" in out["pending"]
    assert "vllm_omni.config.pipeline_registry" not in out["pending"]


def test_on_without_any_config_fails_with_a_clear_message(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HORIZONSERVE_")}
    env.update(HORIZONSERVE_SHM_DIR=str(tmp_path), HORIZONSERVE_VLLM="1")
    code = (
        "from horizonserve.runtime.engine.vllm_omni.plugin import register\n"
        "try:\n    register()\nexcept ValueError as e:\n    print('ERR', e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert "ERR HORIZONSERVE_VLLM=1 but no ServingConfig" in done.stdout, done.stderr[-2000:]


@pytest.fixture
def registry():
    module = import_pipeline_registry()
    saved = dict(module.OMNI_PIPELINES)
    yield module
    module.OMNI_PIPELINES.clear()
    module.OMNI_PIPELINES.update(saved)


def test_register_pipelines_is_idempotent_and_keeps_custom_schedulers(registry):
    import dataclasses

    from horizonserve.runtime.engine.vllm_omni.pipelines import register_pipelines

    custom = "some.model.Scheduler"
    qwen = registry.OMNI_PIPELINES["qwen2_5_omni"]
    talker = dataclasses.replace(qwen.stages[1], scheduler_cls=custom)
    registry.OMNI_PIPELINES["qwen2_5_omni"] = dataclasses.replace(
        qwen, stages=(qwen.stages[0], talker, qwen.stages[2])
    )
    assert register_pipelines(registry, ["qwen2_5_omni", "no_such_model"]) == ["qwen2_5_omni"]
    first = registry.OMNI_PIPELINES["qwen2_5_omni"]
    assert [s.scheduler_cls for s in first.stages] == [AR, custom, GEN]
    register_pipelines(registry, ["qwen2_5_omni"])
    assert registry.OMNI_PIPELINES["qwen2_5_omni"] is first


@pytest.mark.parametrize(
    ("key", "expected"),
    [("qwen2_5_omni", [AR, AR, GEN]), ("mimo_audio", [AR, GEN]), ("bagel", [AR, None])],
)
def test_single_gpu_deploy_files_merge_with_the_pipelines(registry, key, expected):
    from vllm_omni.config.stage_config import load_deploy_config

    from horizonserve.runtime.engine.vllm_omni.pipelines import register_pipelines

    register_pipelines(registry, [key])
    deploy = PLUGIN_DIR / "deploy" / f"{key}.yaml"
    pipeline = registry.resolve_pipeline_config(key)
    assert pipeline.default_deploy_config_name == str(deploy)
    stages = stage_configs_for(pipeline)
    assert [s.scheduler_cls for s in stages] == expected
    assert {str(s.yaml_runtime.get("devices", "0")) for s in stages} == {"0"}
    assert load_deploy_config(deploy).stages[0].max_num_seqs > 1  # batching on stage 0


def test_settings_enablement_and_knobs():
    from horizonserve.runtime.engine.vllm_omni import settings

    assert not settings.enabled({})
    assert settings.enabled({"HORIZONSERVE_VLLM": "1"})
    assert settings.enabled({"HORIZONSERVE_SERVING_CONFIG": "{}"})
    assert not settings.enabled({"HORIZONSERVE_SERVING_CONFIG": "{}", "HORIZONSERVE_VLLM": "0"})
    with pytest.raises(settings.PluginConfigError):
        settings.enabled({"HORIZONSERVE_VLLM": "maybe"})
    knobs = settings.Knobs.from_env({"HORIZONSERVE_VLLM_WINDOW_MARGIN": "all"})
    assert knobs.window_margin is None and knobs.capture_level == "cap"
    with pytest.raises(settings.PluginConfigError):
        settings.Knobs.from_env({"HORIZONSERVE_VLLM_CAPTURE_LEVEL": "half"})


def test_config_precedence_and_calibration(tmp_path):
    from horizonserve.runtime.artifact import load_packaged
    from horizonserve.runtime.config import SmLadder
    from horizonserve.runtime.engine.vllm_omni import settings

    by_pipeline = settings.resolve_config(env={"HORIZONSERVE_PIPELINE": "bagel"})
    assert by_pipeline.pipeline == "bagel"
    assert settings.resolve_config("qwen2_5_omni", env={}).pipeline == "qwen2_5_omni"
    path = tmp_path / "config.json"
    path.write_text(by_pipeline.model_dump_json())
    from_file = settings.resolve_config(env={"HORIZONSERVE_CONFIG_FILE": str(path)})
    assert from_file == by_pipeline
    pinned = by_pipeline.model_copy(
        update={"ladder": SmLadder(levels=[40, 56], aggressive=120, total=132)}
    )
    from_env = settings.resolve_config(
        env={
            "HORIZONSERVE_SERVING_CONFIG": pinned.model_dump_json(),
            "HORIZONSERVE_CONFIG_FILE": str(path),
        }
    )
    assert from_env == pinned
    with pytest.raises(settings.PluginConfigError):
        settings.resolve_config(env={})

    artifact = load_packaged("default-h200.json")
    entry = artifact.pipelines["bagel"]
    calibrated = settings.apply_calibration(by_pipeline, artifact)
    assert calibrated.ladder == entry.ladder  # the default ladder is replaced ...
    assert (
        settings.apply_calibration(pinned, artifact).ladder == pinned.ladder
    )  # ... a pinned one not
    assert calibrated.control.b_sat == entry.b_sat
    for cls in calibrated.slo.classes:
        assert cls.solo_p95_s == entry.solo_p95_s.get(cls.name, cls.solo_p95_s)
    # an artifact measured on vLLM-Omni also carries per-token times: they replace the
    # profiles' of the classes it measured, and only theirs
    name = calibrated.slo.classes[0].name
    measured = entry.model_copy(update={"tpot_s": {name: 0.0375}})
    with_tpot = artifact.model_copy(update={"pipelines": {"bagel": measured}})
    applied = settings.apply_calibration(by_pipeline, with_tpot)
    for before, after in zip(calibrated.slo.classes, applied.slo.classes, strict=True):
        want = 0.0375 if before.name == name else before.profile.tpot_s
        assert after.profile.tpot_s == want
        assert after.profile.model_dump(exclude={"tpot_s"}) == before.profile.model_dump(
            exclude={"tpot_s"}
        )


def test_guess_pipeline_from_the_command_line():
    from horizonserve.runtime.engine.vllm_omni.plugin import guess_pipeline

    assert guess_pipeline(["vllm", "serve", "Qwen/Qwen2.5-Omni-7B", "--omni"]) == "qwen2_5_omni"
    assert guess_pipeline(["vllm", "serve", "/models/BAGEL-7B-MoT", "--omni"]) == "bagel"
    assert guess_pipeline(["vllm-omni", "serve", "XiaomiMiMo/MiMo-Audio-7B-Instruct"]) == (
        "mimo_audio"
    )
    assert guess_pipeline(["vllm", "serve", "some/model"]) is None


def test_when_imported_runs_after_import_and_at_once_when_imported(tmp_path, monkeypatch):
    from horizonserve.runtime.engine.vllm_omni.hooks import pending, when_imported

    (tmp_path / "hs_probe_mod.py").write_text("VALUE = 41\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[int] = []
    when_imported("hs_probe_mod", lambda m: seen.append(m.VALUE + 1))
    assert seen == [] and pending()["hs_probe_mod"] == 1
    import hs_probe_mod

    assert seen == [42] and "hs_probe_mod" not in pending()
    assert hs_probe_mod.__spec__.loader.__class__.__name__ != "_Loader"  # real loader restored
    when_imported("hs_probe_mod", lambda m: seen.append(0))
    assert seen == [42, 0]
    monkeypatch.delitem(sys.modules, "hs_probe_mod")


def test_dockerfile_agrees_with_the_pins_and_the_operator():
    import re

    from horizonserve.operator.builders import serving_command
    from horizonserve.operator.models import Backend

    text = (PLUGIN_DIR / "Dockerfile").read_text()
    pyproject = (ROOT / "pyproject.toml").read_text()
    (pin,) = re.findall(r'"vllm-omni==([0-9.]+)"', pyproject)
    assert re.search(rf"^ARG VLLM_OMNI_VERSION={re.escape(pin)}$", text, re.M)
    # GPU nodes build on vLLM-Omni's release image of the pinned version (the default BASE)
    assert re.search(rf"^ARG BASE=vllm/vllm-omni:v{re.escape(pin)}$", text, re.M)
    assert re.search(r"^FROM \$\{BASE\}$", text, re.M)
    # the project installs under the base's frozen set, and the build fails if any of it changed
    assert "pip install -c /tmp/base-frozen.txt" in text and "the install changed the base" in text
    assert "ENTRYPOINT []" in text and "USER 65532" in text
    for yaml in ("qwen2_5_omni", "mimo_audio", "bagel"):
        assert (PLUGIN_DIR / "deploy" / f"{yaml}.yaml").is_file()
    # The operator starts `vllm serve <model> --omni` for the vllm-omni backend.
    assert Backend.VLLM_OMNI.value == "vllm-omni"
    assert serving_command.__module__ == "horizonserve.operator.builders"
