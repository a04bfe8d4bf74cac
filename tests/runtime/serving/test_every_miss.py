"""Every admitted request is judged: requests that cannot make their SLO (answered late, timed
out at the client's timeout) are misses in the serving process's /metrics, its stats file, the
sidecar's summary and /metrics, and the operator's status — counted when the deadline passes,
not when (or whether) an answer comes. The vLLM-Omni plugin's ApiState follows the same rule.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from horizonserve.runtime import config as cfg
from horizonserve.runtime.engine.reference.defaults import reference_config
from horizonserve.runtime.metrics import MetricsRecorder
from horizonserve.runtime.node_stats import read_stats
from horizonserve.runtime.sidecar import Sidecar
from tests.runtime.serving.served import Served, start_server

pytest.importorskip("torch")

TEXT, IMAGE = 5, 5  # text: answered, all late; image: no first response within timeout_s


def _unmeetable_config(tmp: Path) -> Path:
    """The tiny preset's config with SLOs no request can make (50 µs)."""
    config = reference_config("tiny")
    classes = [c.model_copy(update={"solo_p95_s": 1e-5}) for c in config.slo.classes]
    slo = config.slo.model_copy(update={"classes": classes})
    path = tmp / "serving.json"
    path.write_text(config.model_copy(update={"slo": slo}).model_dump_json())
    return path


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("misses")
    s = start_server(tmp, "--config", str(_unmeetable_config(tmp)), "--stats-interval", "0.2")
    s.stats_file = tmp / "node-stats.json"  # type: ignore[attr-defined]
    yield s
    s.stop()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _value(samples: dict, name: str, **labels: str) -> float | None:
    for (n, ls), v in samples.items():
        if n == name and all(dict(ls).get(k) == val for k, val in labels.items()):
            return v
    return None


def test_requests_that_cannot_make_their_slo_are_misses_everywhere(served: Served) -> None:
    with served.client() as c:
        for i in range(TEXT):
            r = c.post("/v1/requests", json={"id": f"t{i}", "priority": 0, "output_tokens": 2})
            assert r.status_code == 200 and r.json()["slo_met"] is False
        for i in range(IMAGE):
            body = {"id": f"i{i}", "priority": 20, "downstream_tokens": 100, "timeout_s": 0.001}
            assert c.post("/v1/requests", json=body).status_code == 504
    time.sleep(1.0)  # two stats-file writes

    # The serving process's /metrics.
    model = "reference/tiny"
    samples = _samples(httpx.get(served.url + "/metrics", timeout=10).text)
    for name, n in (("text", TEXT), ("image", IMAGE)):
        labels = {"model_name": model, "request_class": name}
        assert _value(samples, "horizonserve:slo_misses_total", **labels) == n
        assert _value(samples, "horizonserve:slo_attainment_ratio", **labels) == 0.0
    assert (
        _value(
            samples,
            "horizonserve:request_success_total",
            request_class="image",
            finished_reason="timeout",
        )
        == IMAGE
    )

    # The stats file the sidecar reads.
    stats = read_stats(served.stats_file)  # type: ignore[attr-defined]
    assert stats is not None
    by_name = {c.name: c for c in stats[0]}
    assert (by_name["text"].requests, by_name["text"].met) == (TEXT, 0)
    assert (by_name["image"].requests, by_name["image"].met) == (IMAGE, 0)

    # The sidecar's summary and its /metrics (relaying the serving process's).
    sidecar = Sidecar(
        serving=reference_config("tiny"),
        node="n1",
        mode=cfg.CalibrationMode.SKIP,
        artifact_dir=served.shm / "art",
        stats_file=served.stats_file,  # type: ignore[attr-defined]
        publisher=None,
        gpu=None,
        serving_metrics_url=served.url + "/metrics",
    )
    summary = sidecar.publish_once(time.time())
    assert (summary.requests, summary.met) == (TEXT + IMAGE, 0)
    relayed = _samples(sidecar.metrics_text().decode())
    labels = {"model_name": model, "request_class": "image"}
    assert _value(relayed, "horizonserve:node_slo_attainment_ratio", **labels) == 0.0
    assert _value(relayed, "horizonserve:slo_misses_total", **labels) == IMAGE

    # The operator's status, aggregated from the published summary.
    from horizonserve.operator import status
    from horizonserve.operator.nodes import Selection
    from horizonserve.operator.pods import PodState
    from horizonserve.operator.translate import translate

    spec, config = translate({"pipeline": "qwen2_5_omni", "allGpuNodes": True})
    pod = PodState("p", "ns", "uid-p", "n1", "h", "Running", ready=True)
    obs = status.Observed(
        generation=1,
        spec=spec,
        config=config,
        spec_error=None,
        selection=Selection(frozenset({"n1"}), frozenset({"n1"})),
        pods=[pod],
        template_hash="h",
        summaries={"n1": summary.to_annotation()},
    )
    st = status.build_status(obs, now=time.time())
    assert st["attainment"] == 0.0
    classes = {c["name"]: c for c in st["classes"]}
    assert classes["image"]["requests"] == IMAGE and classes["image"]["attainment"] == 0.0


def test_the_plugin_judges_a_request_without_a_first_response(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    from horizonserve.runtime.engine.vllm_omni.api import ApiState

    config = reference_config("tiny")
    state = ApiState(
        config,
        recorder=MetricsRecorder(CollectorRegistry(), model_name=config.model),
        stats_file=tmp_path / "stats.json",
    )
    target = config.slo.target_s("image")
    state.stamp("late", 20, None, time.time() - 2 * target)  # its deadline passed
    state.stamp("gone", 20, None, time.time())  # its client leaves before the deadline
    state.client_gone("gone", time.monotonic_ns())
    state.write_stats_once()
    classes, _, _ = read_stats(tmp_path / "stats.json")  # type: ignore[misc]
    image = next(c for c in classes if c.name == "image")
    assert (image.requests, image.met) == (1, 0)
    assert json.loads((tmp_path / "stats.json").read_text())["classes"]
