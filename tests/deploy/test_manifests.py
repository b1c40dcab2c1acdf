"""Static checks of deploy/: the compose file and the Kubernetes overlays parse and render,
validate against the Kubernetes schemas, and name only what exists — the images
scripts/build-images.sh builds, configuration the gateway accepts, its /ready and /health
routes, the tiers' ports and model names; the images run as the users they say."""

from __future__ import annotations

import shutil
from pathlib import Path

import jsonschema
import pytest
import yaml

from gateway.config import load_settings
from router import Tier
from tests.deploy.manifests import (
    BUILT_IMAGES,
    DEPLOY,
    OVERLAYS,
    by_kind,
    compose,
    containerfile_directives,
    containers,
    crd_schema,
    default_image,
    flags,
    gateway_answers,
    render,
)

needs_kubectl = pytest.mark.skipif(
    shutil.which("kubectl") is None, reason="kubectl (Debian's kubernetes-client) is not installed"
)


def test_the_gateway_serves_the_probed_paths() -> None:
    # /ready says 503 until a replica of every tier has answered: a route, not a 404
    assert gateway_answers() == {"/health": 200, "/ready": 503, "/metrics": 200}


def test_compose_config_loads_and_names_the_tiers_that_compose_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    services = compose()["services"]
    monkeypatch.setenv("GEARSHIFT_STORE__URL", "postgresql://u:p@127.0.0.1:5432/gearshift")
    monkeypatch.setenv("GEARSHIFT_SANDBOX__TOKEN", "t")  # compose gives its file
    settings = load_settings(DEPLOY / "compose" / "gearshift.yaml")
    for tier, service in ((Tier.FULL, "vllm-full"), (Tier.FAST, "vllm-fast")):
        args = flags(services[service]["command"])
        assert settings.tiers[tier].model == args["served-model-name"]
        assert settings.tiers[tier].replicas == [f"http://127.0.0.1:{args['port']}"]
        assert args["host"] == "127.0.0.1"
        assert args["model"].startswith("/models/")
    assert settings.host == "127.0.0.1" and settings.sandbox.host == "127.0.0.1"
    assert settings.sandbox.external == f"http://127.0.0.1:{settings.sandbox.port}"
    assert settings.telemetry.otlp_endpoint == "http://127.0.0.1:4318/v1/traces"
    prometheus = yaml.safe_load((DEPLOY / "compose" / "prometheus.yml").read_text())
    targets = {t for job in prometheus["scrape_configs"] for s in job["static_configs"] for t in s["targets"]}  # fmt: skip
    assert targets == {f"127.0.0.1:{p}" for p in (settings.port, 8101, 8102)}


def test_compose_services_bind_loopback_use_built_images_and_existing_files() -> None:
    doc = compose()
    secrets_script = (DEPLOY / "compose" / "make-secrets.sh").read_text()
    for name, service in doc["services"].items():
        assert service["network_mode"] == "host", name  # no bridge network: loopback only
        image = default_image(service["image"])
        if image.startswith("localhost/"):
            assert image in BUILT_IMAGES, (name, image)
        else:  # a public image, pinned to a version
            assert ":" in image and not image.endswith(":latest"), (name, image)
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (DEPLOY / source).exists(), (name, source)
    for secret, spec in doc["secrets"].items():
        assert spec["file"] == f"./compose/secrets/{secret}"
        assert f'"$dir/{secret}"' in secrets_script, secret  # make-secrets.sh writes it
    check = doc["services"]["gateway"]["healthcheck"]["test"]
    assert "http://127.0.0.1:8000/ready" in " ".join(check)


def test_compose_privileges_only_for_the_sandbox() -> None:
    services = compose()["services"]
    assert services["sandbox"]["user"] == "0" and services["sandbox"]["privileged"] is True
    for name in ("gateway", "vllm-full", "vllm-fast"):
        service = services[name]
        assert "user" not in service and not service.get("privileged"), name
        assert service["cap_drop"] == ["ALL"] and "no-new-privileges" in service["security_opt"]


@pytest.mark.parametrize("name", ["gateway", "vllm-cpu"])
def test_containerfiles_run_as_an_unprivileged_user_on_a_configurable_base(name: str) -> None:
    directives = containerfile_directives(name)
    users = [rest for word, rest in directives if word == "USER"]
    assert users and users[-1] == "10001:10001"
    args = [rest for word, rest in directives if word == "ARG"]
    assert "BASE_IMAGE=docker.io/library/debian:bookworm-slim" in args
    assert ("FROM", "${BASE_IMAGE}") in directives
    installs = " ".join(rest for word, rest in directives if word == "RUN")
    assert "--no-index" in installs  # from the wheels in the build context only
    if name == "gateway":
        assert "bubblewrap" in installs and "libseccomp2" in installs


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_and_validates_against_the_kubernetes_schemas(overlay: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    docs = render(overlay)
    core = [d for d in docs if d["kind"] not in ("InferencePool", "HTTPRoute")]
    for doc in core:
        kubernetes_validate.validate(doc, "1.32", strict=True)
    with pytest.raises(kubernetes_validate.ValidationError):  # the validator does check
        bad = {**core[0], "spec": {"no_such_field": 1}}
        kubernetes_validate.validate(bad, "1.32", strict=True)
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "ConfigMap", "Secret", "NetworkPolicy", "Job",
            "PodDisruptionBudget", "HorizontalPodAutoscaler"} <= kinds  # fmt: skip
    crds = {"InferencePool": "inferencepool-v1.json", "HTTPRoute": "httproute-v1.json"}
    for doc in docs:
        if doc["kind"] in crds:  # against the vendored schemas (tests/deploy/crds)
            jsonschema.validate(doc, crd_schema(crds[doc["kind"]]))
    if overlay == "inference-extension":
        assert len(by_kind(docs, "InferencePool")) == 2 and len(by_kind(docs, "HTTPRoute")) == 2
        pool = by_kind(docs, "InferencePool")["vllm-full"]
        with pytest.raises(jsonschema.ValidationError):  # a misspelt field is refused
            bad = {**pool, "spec": {**pool["spec"], "targetPort": 8000}}
            jsonschema.validate(bad, crd_schema("inferencepool-v1.json"))


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_wires_config_probes_tiers_and_privileges(
    overlay: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = render(overlay)
    deployments, services = by_kind(docs, "Deployment"), by_kind(docs, "Service")
    config = tmp_path / "gearshift.yaml"
    config.write_text(next(iter(by_kind(docs, "ConfigMap").values()))["data"]["gearshift.yaml"])
    monkeypatch.setenv("GEARSHIFT_STORE__URL", "postgresql://u:p@db:5432/gearshift")
    monkeypatch.setenv("GEARSHIFT_SANDBOX__TOKEN", "t")  # the pods read theirs from files
    settings = load_settings(config)  # the gateway accepts it (keys, host, every field)
    answers = gateway_answers()

    gateway = deployments["gearshift-gateway"]
    (container,) = containers(gateway)
    assert container["image"] in BUILT_IMAGES
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert answers["/health"] == 200 and answers["/ready"] == 503  # both are routes
    assert container["ports"][0]["containerPort"] == settings.port
    pod = gateway["spec"]["template"]["spec"]
    assert (
        pod["securityContext"]["runAsNonRoot"] is True
        and pod["automountServiceAccountToken"] is False
    )

    sandbox = deployments["gearshift-sandbox"]["spec"]["template"]["spec"]
    assert sandbox["automountServiceAccountToken"] is False
    assert settings.sandbox.external is not None  # the gateway uses the sandbox Deployment
    host, port = settings.sandbox.external.removeprefix("http://").split(":")
    assert services[host]["spec"]["ports"][0]["port"] == int(port) == settings.sandbox.port
    policies = by_kind(docs, "NetworkPolicy")
    assert policies["gearshift-sandbox"]["spec"]["egress"] == []
    assert (sandbox.get("runtimeClassName") == "gvisor") == (overlay != "cpu")

    if overlay == "inference-extension":
        routed = {r["spec"]["rules"][0]["matches"][0]["headers"][0]["value"] for r in by_kind(docs, "HTTPRoute").values()}  # fmt: skip
        assert routed == {t.model for t in settings.tiers.values()}
        return
    for tier in settings.tiers.values():  # each replica URL is a Service in front of its tier
        (url,) = tier.replicas
        host, port = url.removeprefix("http://").split(":")
        selector = services[host]["spec"]["selector"]
        assert services[host]["spec"]["ports"][0]["port"] == int(port)
        (engine,) = [d for d in deployments.values()
                     if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()]  # fmt: skip
        assert flags(containers(engine)[0]["args"])["served-model-name"] == tier.model


def _secret_files(env: list[dict[str, object]]) -> dict[str, str]:
    return {str(e["name"]): str(e["value"]) for e in env if str(e["name"]).endswith("_FILE")}


def test_compose_gives_secrets_as_files_only() -> None:
    doc = compose()
    for name, service in doc["services"].items():
        env = service.get("environment", {})
        for var, value in env.items():
            assert var.endswith("_FILE") or "PASSWORD" not in var, (name, var)
            if var.startswith("GEARSHIFT_"):  # every Gearshift secret is a mounted secret file
                assert var.endswith("_FILE"), (name, var)
                assert value.removeprefix("/run/secrets/") in service["secrets"], (name, value)
        assert "entrypoint" not in service, name  # no shell that cats secrets into variables
    assert set(doc["services"]["sandbox"]["secrets"]) == {"sandbox-token"}


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_mounts_secrets_as_files_and_each_pod_only_its_own(overlay: str) -> None:
    docs = render(overlay)
    (secret,) = by_kind(docs, "Secret").values()
    wanted = {"gearshift-gateway": {"store-url", "sandbox-token", "api-keys.yaml"},
              "gearshift-sandbox": {"sandbox-token"}, "gearshift-db-upgrade": {"store-url"}}  # fmt: skip
    pods = {**{n: d["spec"]["template"]["spec"] for n, d in by_kind(docs, "Deployment").items()},
            **{n: d["spec"]["template"]["spec"] for n, d in by_kind(docs, "Job").items()}}  # fmt: skip
    for name, keys in wanted.items():
        pod = pods[name]
        (container,) = pod["containers"]
        env = container.get("env", [])
        assert not [e for e in env if "valueFrom" in e], name  # no secret as a variable's value
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounted: set[str] = set()
        for mount in container["volumeMounts"]:
            source = volumes[mount["name"]].get("secret")
            if source is None:
                continue
            assert source["secretName"] == secret["metadata"]["name"] and mount["readOnly"]
            items = source.get("items") or [{"key": k, "path": k} for k in secret["stringData"]]
            mounted |= {f"{mount['mountPath']}/{i['path']}" for i in items}
            assert {i["key"] for i in items} == keys, name  # only what this pod needs
        files = _secret_files(env)
        assert files and set(files.values()) <= mounted, (name, files, mounted)
    api_keys = yaml.safe_load(secret["stringData"]["api-keys.yaml"])
    assert api_keys[0]["admin"] is True and len(api_keys[0]["sha256"]) == 64
