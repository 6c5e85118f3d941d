"""docker/ and the KubeRay manifests: what can be checked without a Docker engine or a Kubernetes cluster.

- `docker-compose config` (Debian's docker-compose parses without an engine) accepts compose.yaml with
  .env.example and refuses to run without the secrets;
- the KubeRay manifests meet a structural schema of the ray.io/v1 RayCluster / RayJob fields they use;
- every `python -m tune_as.search`, `ray ...` and `mlflow server` command in docker/ and docs/cluster.md
  parses with the real CLIs (a renamed option breaks this test, not a user's cluster);
- ports, volumes, versions and variables agree across the Dockerfile, compose, the manifests and the docs.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
import jsonschema
import pytest
import yaml
from conftest import REPO
from packaging.requirements import Requirement

from tune_as.search import build_parser

DOCKER = REPO / "docker"
COMPOSE = DOCKER / "compose.yaml"
ENV_EXAMPLE = DOCKER / ".env.example"
DOCKERFILE = DOCKER / "Dockerfile"
RAYCLUSTER = DOCKER / "kuberay" / "raycluster.yaml"
RAYJOB = DOCKER / "kuberay" / "rayjob-search.yaml"
DOCS = (DOCKER / "README.md", REPO / "docs" / "cluster.md")
SECRETS = ("RAY_AUTH_TOKEN", "POSTGRES_PASSWORD")
RAY_SERVICES = ("ray-head", "ray-worker-0", "ray-worker-1")

# --- reading the files ------------------------------------------------------------------------------

_VAR = re.compile(r"\$\{(\w+)(?:(:?[-?])([^}]*))?\}")


def _env_example() -> dict[str, str]:
    pairs = (line.split("=", 1) for line in ENV_EXAMPLE.read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#"))
    return {k.strip(): v.strip() for k, v in pairs}


def _interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's ${VAR}, ${VAR:-default}, ${VAR:?error} on every string of a parsed compose file."""
    if isinstance(value, dict):
        return {k: _interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match[str]) -> str:
        name, op, arg = m.group(1), m.group(2) or "", m.group(3) or ""
        if env.get(name):
            return env[name]
        if op.endswith("?"):
            raise KeyError(f"{name}: {arg}")
        return arg

    return _VAR.sub(sub, value)


def _compose(env: dict[str, str] | None = None) -> dict[str, Any]:
    """compose.yaml as `docker compose` sees it with `env` (default: .env.example)."""
    return _interpolate(yaml.safe_load(COMPOSE.read_text()), _env_example() if env is None else env)


def _services() -> dict[str, Any]:
    return _compose()["services"]


def _argv(service: dict[str, Any]) -> list[str]:
    return [*service.get("entrypoint", []), *service.get("command", [])]


def _dockerfile_args() -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", DOCKERFILE.read_text(), re.M))


def _kube_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _raycluster() -> dict[str, Any]:
    (cluster,) = [d for d in _kube_docs(RAYCLUSTER) if d["kind"] == "RayCluster"]
    return cluster


def _pod_specs(cluster: dict[str, Any]) -> list[dict[str, Any]]:
    spec = cluster["spec"]
    return [spec["headGroupSpec"]["template"]["spec"],
            *(g["template"]["spec"] for g in spec["workerGroupSpecs"])]


def _flag(argv: list[str], name: str) -> str:
    """The value of `--name=value` or `--name value` in argv."""
    for i, token in enumerate(argv):
        if token.startswith(f"{name}="):
            return token.split("=", 1)[1]
        if token == name:
            return argv[i + 1]
    raise AssertionError(f"{name} not in {argv}")


def _port(url: str) -> int:
    port = urlsplit(url if "://" in url else f"//{url}").port
    assert port is not None, url
    return port


# --- commands: extracted from every file, parsed by the real CLIs -----------------------------------

_SHELL_OPERATORS = {"&&", "||", "|", ";", "&", ">", ">>", "<", "(", ")"}


def _doc_commands(path: Path) -> list[list[str]]:
    """Simple commands of the shell code blocks of a Markdown file (continuations joined, split at
    operators)."""
    commands = []
    for block in re.findall(r"```(?:bash|sh|shell)\n(.*?)```", path.read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.commenters = "#"
            lexer.whitespace_split = True
            current: list[str] = []
            for token in lexer:
                if token in _SHELL_OPERATORS:
                    commands.append(current)
                    current = []
                else:
                    current.append(token)
            commands.append(current)
    return [c for c in commands if c]


def _file_commands() -> dict[str, list[list[str]]]:
    """Every command of docker/, the manifests and the docs, by where it comes from."""
    found: dict[str, list[list[str]]] = {}
    for name, service in _services().items():
        found[f"compose.yaml:{name}"] = [_argv(service)] if _argv(service) else []
    head = _raycluster()["spec"]["headGroupSpec"]
    params = [f"--{k}={v}" for k, v in head["rayStartParams"].items()]
    found["raycluster.yaml:head rayStartParams"] = [["ray", "start", "--head", *params]]
    for group in _raycluster()["spec"]["workerGroupSpecs"]:
        params = [f"--{k}={v}" for k, v in group["rayStartParams"].items()]
        found[f"raycluster.yaml:{group['groupName']} rayStartParams"] = \
            [["ray", "start", "--address=h:6379", *params]]
    (job,) = _kube_docs(RAYJOB)
    found["rayjob-search.yaml:entrypoint"] = [shlex.split(job["spec"]["entrypoint"])]
    for doc in DOCS:
        found[str(doc.relative_to(REPO))] = _doc_commands(doc)
    return found


def _strip_env_assignments(argv: list[str]) -> list[str]:
    while argv and re.match(r"^\w+=", argv[0]) and not argv[0].startswith("--"):
        argv = argv[1:]
    if argv[:1] == ["export"]:
        return []
    return argv


def _click_command(group: click.Group, argv: list[str]) -> tuple[click.Command, list[str]]:
    command: click.Command = group
    while isinstance(command, click.Group) and argv and argv[0] in command.commands:
        command, argv = command.commands[argv[0]], argv[1:]
    return command, argv


def _check_command(argv: list[str]) -> list[str]:
    """Parse argv with the CLI(s) it calls; their names (none for commands this test does not know)."""
    argv = _strip_env_assignments(argv)
    if argv[:1] == ["ray"]:
        from ray.scripts.scripts import cli as ray_cli

        command, rest = _click_command(ray_cli, argv[1:])
        command.make_context(" ".join(argv[:2]), list(rest))  # click consumes the list
        inner = _check_command(rest[rest.index("--") + 1:]) if command.name == "submit" else []
        return [f"ray {command.name}", *inner]  # a job's entrypoint is a command too
    if argv[:2] == ["mlflow", "server"]:
        from mlflow.cli import cli as mlflow_cli

        command, rest = _click_command(mlflow_cli, argv[1:])
        command.make_context("mlflow server", rest)
        return ["mlflow server"]
    if "tune_as.search" in argv:
        args = build_parser().parse_args(argv[argv.index("tune_as.search") + 1:])
        from tune_as.tasks import TASKS

        assert args.task in TASKS, f"--task {args.task!r} is not a task: {sorted(TASKS)}"
        return ["tune_as.search"]
    return []


@pytest.mark.slow
def test_every_command_parses_with_the_real_cli() -> None:
    checked: dict[str, set[str]] = {}
    for where, commands in _file_commands().items():
        for argv in commands:
            try:
                checked.setdefault(where, set()).update(_check_command(argv))
            except (SystemExit, click.ClickException, AssertionError, ValueError) as exc:
                pytest.fail(f"{where}: {shlex.join(argv)}\n  does not parse: {exc!r}")
    # The extraction itself must work: each file's main commands were found and parsed.
    assert {"ray start"} <= checked["compose.yaml:ray-head"]
    assert {"ray start"} <= checked["compose.yaml:ray-worker-0"]
    assert {"ray submit", "tune_as.search"} <= checked["compose.yaml:search"]
    assert {"mlflow server"} <= checked["compose.yaml:mlflow"]
    assert {"ray start"} <= checked["raycluster.yaml:head rayStartParams"]
    assert {"tune_as.search"} <= checked["rayjob-search.yaml:entrypoint"]
    assert {"tune_as.search", "ray start", "ray submit", "mlflow server", "ray get-auth-token"} <= checked[
        "docs/cluster.md"]


def test_command_checker_rejects_an_unknown_option() -> None:
    """The check above would pass vacuously if a typo slipped through the parsers."""
    with pytest.raises(SystemExit):
        _check_command(["python", "-m", "tune_as.search", "--task", "clinc_oos", "--gpus-per-trail", "1"])
    with pytest.raises(click.UsageError):
        _check_command(["ray", "start", "--head", "--dashboard-prot=8265"])


# --- compose ----------------------------------------------------------------------------------------


def _compose_cli() -> list[str]:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"],
                                                 capture_output=True).returncode == 0:
        return ["docker", "compose"]
    pytest.skip("neither docker-compose nor the docker compose plugin is installed "
                "(Debian: apt-get install docker-compose; .ci/run does it when run as root)")


def _compose_config(env_file: Path) -> subprocess.CompletedProcess[str]:
    # A bare environment: a RAY_AUTH_TOKEN exported in the caller's shell must not hide a missing one.
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(env_file.parent)}
    return subprocess.run([*_compose_cli(), "--env-file", str(env_file), "-f", str(COMPOSE), "config"],
                          cwd=DOCKER, env=env, capture_output=True, text=True, timeout=60)


def test_docker_compose_config_accepts_the_file(tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    shutil.copy(ENV_EXAMPLE, env_file)
    res = _compose_config(env_file)
    assert res.returncode == 0, res.stderr
    config = yaml.safe_load(res.stdout)
    assert set(config["services"]) >= {"postgres", "mlflow", "ray-head", *RAY_SERVICES, "search"}
    assert config["services"]["ray-head"]["environment"]["RAY_AUTH_TOKEN"] == _env_example()["RAY_AUTH_TOKEN"]
    published = [p for s in config["services"].values() for p in s.get("ports", [])]
    # docker-compose 1.x prints "127.0.0.1:5000:5000/tcp", the v2 plugin {"host_ip": "127.0.0.1", ...}
    hosts = [p["host_ip"] if isinstance(p, dict) else p.split(":")[0] for p in published]
    assert hosts and set(hosts) == {"127.0.0.1"}, published


@pytest.mark.parametrize("secret", SECRETS)
def test_docker_compose_refuses_to_run_without_a_secret(tmp_path: Path, secret: str) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in _env_example().items() if k != secret))
    res = _compose_config(env_file)
    assert res.returncode != 0
    assert secret in res.stderr and "docker/.env" in res.stderr


def test_compose_variables_match_env_example() -> None:
    used = set(_VAR.findall(COMPOSE.read_text()))
    used_names = {name for name, _, _ in used}
    assert used_names == set(_env_example()), (
        f"in compose.yaml only: {sorted(used_names - set(_env_example()))}; "
        f"in .env.example only: {sorted(set(_env_example()) - used_names)}")
    # Secrets have no default: compose must stop and say where to set them.
    for name, op, _ in used:
        if name in SECRETS:
            assert op == ":?", f"${{{name}}} must be written ${{{name}:?...}} in compose.yaml"
    assert all(_env_example()[s] == "change-me" for s in SECRETS), ".env.example must not carry real secrets"


def test_env_file_with_the_secrets_is_git_ignored() -> None:
    res = subprocess.run(["git", "check-ignore", "-q", "docker/.env"], cwd=REPO)
    assert res.returncode == 0, "docker/.env (the real secrets) must be git-ignored"
    assert subprocess.run(["git", "check-ignore", "-q", "docker/.env.example"], cwd=REPO).returncode == 1


@pytest.mark.parametrize("env", [None, {}], ids=["env-example", "no-env-file-defaults"])
def test_published_ports_bind_loopback_by_default(env: dict[str, str] | None) -> None:
    defaults = {s: "x" for s in SECRETS} if env is not None else None
    services = _compose(defaults)["services"]
    published = [(name, p) for name, s in services.items() for p in s.get("ports", [])]
    assert {name for name, _ in published} == {"mlflow", "ray-head", "optuna-dashboard"}
    assert all(p.startswith("127.0.0.1:") for _, p in published), published
    assert "ports" not in services["postgres"], "PostgreSQL must not be published"


def test_ray_services_use_token_auth_gpus_and_shared_storage() -> None:
    services = _services()
    for name in (*RAY_SERVICES, "search"):
        env = services[name]["environment"]
        assert env["RAY_AUTH_MODE"] == "token", name
        assert env["RAY_AUTH_TOKEN"] == _env_example()["RAY_AUTH_TOKEN"], name
    gpu_ids = []
    for name in RAY_SERVICES[1:]:
        (device,) = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and "gpu" in device["capabilities"], name
        gpu_ids += device["device_ids"]
    assert len(gpu_ids) == len(set(gpu_ids)) == len(RAY_SERVICES) - 1, \
        f"one distinct GPU per worker: {gpu_ids}"
    assert _flag(services["ray-head"]["command"], "--num-gpus") == "0"
    storage = Path(_flag(_argv(services["search"]), "--storage-path"))
    hf_home = services["ray-head"]["environment"]["HF_HOME"]
    for name in RAY_SERVICES:
        mounts = {m.split(":")[1]: m.split(":")[0] for m in services[name]["volumes"]}
        assert any(storage.is_relative_to(target) for target in mounts), \
            f"{name}: {storage} is not on a volume"
        assert mounts.get(hf_home) == "hf-cache", f"{name}: HF_HOME {hf_home} must be the hf-cache volume"
        assert services[name]["environment"]["HF_HOME"] == hf_home
    for name in ("postgres", "mlflow", *RAY_SERVICES):
        assert services[name].get("healthcheck", {}).get("test"), f"{name} has no healthcheck"


def test_compose_ports_agree_between_services() -> None:
    s = _services()
    head = s["ray-head"]["command"]
    gcs, dashboard = int(_flag(head, "--port")), int(_flag(head, "--dashboard-port"))
    assert _flag(head, "--dashboard-host") == "0.0.0.0"  # inside the container; the host side is 127.0.0.1
    for worker in RAY_SERVICES[1:]:
        assert _port(_flag(s[worker]["command"], "--address")) == gcs
    search = _argv(s["search"])
    assert _port(_flag(search, "--address")) == dashboard  # `ray job submit --address`: the job API
    assert _flag(search[search.index("tune_as.search"):], "--address") == "auto"
    assert int(s["ray-head"]["ports"][0].rsplit(":", 1)[1]) == dashboard
    assert f":{dashboard}/" in s["ray-head"]["healthcheck"]["test"][-1]

    mlflow = int(_flag(s["mlflow"]["command"], "--port"))
    assert int(s["mlflow"]["ports"][0].rsplit(":", 1)[1]) == mlflow
    assert f":{mlflow}/health" in s["mlflow"]["healthcheck"]["test"][-1]
    client_url = _flag(search, "--mlflow-uri")
    assert _port(client_url) == mlflow and s["ray-head"]["environment"]["MLFLOW_TRACKING_URI"] == client_url
    allowed = s["mlflow"]["environment"]["MLFLOW_SERVER_ALLOWED_HOSTS"].split(",")
    assert urlsplit(client_url).netloc in allowed, "MLflow would answer the Ray nodes with 403 (Host header)"

    from ray._private.ray_constants import DEFAULT_DASHBOARD_AGENT_LISTEN_PORT

    assert f":{DEFAULT_DASHBOARD_AGENT_LISTEN_PORT}/" in s["ray-worker-0"]["healthcheck"]["test"][-1]


def test_mlflow_backend_is_the_postgres_service() -> None:
    s = _services()
    uri = urlsplit(s["mlflow"]["environment"]["MLFLOW_BACKEND_STORE_URI"])
    pg = s["postgres"]["environment"]
    assert uri.scheme == "postgresql+psycopg2"  # SQLAlchemy 2.1: bare postgresql:// means psycopg 3
    assert (uri.hostname, uri.username, uri.password, uri.path) == (
        "postgres", pg["POSTGRES_USER"], pg["POSTGRES_PASSWORD"], f"/{pg['POSTGRES_DB']}")
    assert s["mlflow"]["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_optuna_dashboard_opens_the_study_the_search_writes() -> None:
    s = _services()
    search = _argv(s["search"])
    study = Path(_flag(search, "--storage-path")) / _flag(search, "--name") / "optuna.db"
    assert s["optuna-dashboard"]["command"][-1] == f"sqlite:///{study}"


# --- Dockerfile -------------------------------------------------------------------------------------


def _pyproject() -> dict[str, Any]:
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_dockerfile_pins_versions_the_project_accepts() -> None:
    import ray

    args = _dockerfile_args()
    deps = {Requirement(d).name: Requirement(d) for d in _pyproject()["project"]["dependencies"]}
    assert args["TORCH_VERSION"] in deps["torch"].specifier
    assert args["RAY_VERSION"] in deps["ray"].specifier
    assert args["RAY_VERSION"] == ray.__version__, "the image's Ray must be the Ray tested here"
    cuda = re.search(r"nvidia/cuda:(\d+)\.(\d+)\.\d+-cudnn-runtime-", args["CUDA_IMAGE"])
    assert cuda, f"expected a CUDA runtime base image, got {args['CUDA_IMAGE']}"
    assert args["TORCH_INDEX_URL"].endswith(f"/cu{cuda[1]}{cuda[2]}"), \
        "torch's CUDA must match the base image's"
    extras = set(args["EXTRAS"].split(","))
    assert extras <= set(_pyproject()["project"]["optional-dependencies"])
    assert {"postgres", "dashboard"} <= extras  # mlflow on PostgreSQL, optuna-dashboard


def test_dockerfile_runs_as_a_non_root_user_with_hf_home_on_a_volume() -> None:
    text = DOCKERFILE.read_text()
    users = re.findall(r"^USER (\S+)$", text, re.M)
    assert users and users[-1] not in ("root", "0"), "the image must end as a non-root user"
    hf_home = re.search(r"HF_HOME=(\S+)", text)
    assert hf_home and hf_home[1] in re.search(r"^VOLUME \[(.*)\]$", text, re.M)[1]  # type: ignore[index]
    assert hf_home[1] == _services()["ray-head"]["environment"]["HF_HOME"]
    assert re.search(r"RAY_AUTH_MODE=token", text)
    # A new named volume takes the owner of its mount point: the image must give every one to its user.
    owned = [Path(p)
             for p in re.search(r"chown -R tune:tune (.+)$", text, re.M)[1].split()]  # type: ignore[index]
    for name, service in _services().items():
        if service.get("image") == _env_example()["TUNE_AS_IMAGE"]:
            for target in (Path(v.split(":")[1]) for v in service.get("volumes", [])):
                assert any(target.is_relative_to(o) for o in owned), \
                    f"{name}: {target} is not owned by the user"
    for src in re.findall(r"^COPY (?:--\S+ )*(.+) \S+$", text, re.M):
        for path in src.split():
            assert (REPO / path).exists(), f"COPY {path}: not in the build context"


# --- KubeRay ----------------------------------------------------------------------------------------

_STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_CONTAINER = {
    "type": "object", "required": ["name", "image"],
    "properties": {
        "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
        "image": {"type": "string", "minLength": 1},
        "env": {"type": "array", "items": {"type": "object", "required": ["name"],
                                           "properties": {"name": {"type": "string"},
                                                          "value": {"type": "string"}}}},
        "ports": {"type": "array", "items": {"type": "object", "required": ["containerPort"],
                                             "properties": {"containerPort": {"type": "integer"},
                                                            "name": {"type": "string", "maxLength": 15}}}},
        "resources": {"type": "object", "additionalProperties": False,
                      "properties": {"requests": {"type": "object"}, "limits": {"type": "object"}}},
        "volumeMounts": {"type": "array", "items": {"type": "object", "required": ["name", "mountPath"]}},
    },
}
_POD_TEMPLATE = {
    "type": "object", "required": ["spec"],
    "properties": {"spec": {"type": "object", "required": ["containers"],
                            "properties": {"containers": {"type": "array", "minItems": 1,
                                                          "items": _CONTAINER},
                                           "volumes": {"type": "array",
                                                       "items": {"type": "object", "required": ["name"]}}}}},
}
_RAYCLUSTER_SPEC = {
    "type": "object", "required": ["headGroupSpec"], "additionalProperties": False,
    "properties": {
        "rayVersion": {"type": "string"},
        "enableInTreeAutoscaling": {"type": "boolean"},
        "authOptions": {"type": "object", "properties": {"mode": {"enum": ["disabled", "token"]}},
                        "additionalProperties": False},
        "headGroupSpec": {
            "type": "object", "required": ["template"], "additionalProperties": False,
            "properties": {"serviceType": {"enum": ["ClusterIP", "NodePort", "LoadBalancer"]},
                           "rayStartParams": _STR_MAP, "template": _POD_TEMPLATE}},
        "workerGroupSpecs": {"type": "array", "items": {
            "type": "object", "required": ["groupName", "template"], "additionalProperties": False,
            "properties": {"groupName": {"type": "string"}, "replicas": {"type": "integer", "minimum": 0},
                           "minReplicas": {"type": "integer", "minimum": 0},
                           "maxReplicas": {"type": "integer", "minimum": 0},
                           "rayStartParams": _STR_MAP, "template": _POD_TEMPLATE}}},
    },
}
_METADATA = {"type": "object", "required": ["name"],
             "properties": {"name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"}}}
SCHEMAS: dict[str, dict[str, Any]] = {
    "RayCluster": {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
                   "properties": {"apiVersion": {"const": "ray.io/v1"}, "metadata": _METADATA,
                                  "spec": _RAYCLUSTER_SPEC}},
    "RayJob": {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
               "properties": {"apiVersion": {"const": "ray.io/v1"}, "metadata": _METADATA, "spec": {
                   "type": "object", "required": ["entrypoint"], "additionalProperties": False,
                   "oneOf": [{"required": ["clusterSelector"]}, {"required": ["rayClusterSpec"]}],
                   "properties": {
                       "entrypoint": {"type": "string", "minLength": 1},
                       "clusterSelector": _STR_MAP, "rayClusterSpec": _RAYCLUSTER_SPEC,
                       "submissionMode": {"enum": ["K8sJobMode", "HTTPMode", "InteractiveMode",
                                                   "SidecarMode"]},
                       "activeDeadlineSeconds": {"type": "integer", "minimum": 1},
                       "shutdownAfterJobFinishes": {"type": "boolean"},
                       "ttlSecondsAfterFinished": {"type": "integer", "minimum": 0},
                       "runtimeEnvYAML": {"type": "string"}}}}},
    "PersistentVolumeClaim": {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
                              "properties": {"apiVersion": {"const": "v1"}, "metadata": _METADATA, "spec": {
                                  "type": "object", "required": ["accessModes", "resources"]}}},
}


@pytest.mark.parametrize("path", [RAYCLUSTER, RAYJOB], ids=lambda p: p.name)
def test_kuberay_manifests_meet_the_schema(path: Path) -> None:
    for doc in _kube_docs(path):
        assert doc.get("kind") in SCHEMAS, f"{path.name}: unexpected kind {doc.get('kind')!r}"
        jsonschema.validate(doc, SCHEMAS[doc["kind"]])


def test_schema_catches_the_usual_mistakes() -> None:
    """An int in rayStartParams (the CRD wants strings) or a misspelt field must not pass."""
    cluster = _raycluster()
    cluster["spec"]["headGroupSpec"]["rayStartParams"]["num-gpus"] = 0
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(cluster, SCHEMAS["RayCluster"])
    cluster = _raycluster()
    cluster["spec"]["workerGroupSpec"] = cluster["spec"].pop("workerGroupSpecs")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(cluster, SCHEMAS["RayCluster"])


def test_kuberay_cluster_agrees_with_the_image_and_the_job() -> None:
    cluster, (job,) = _raycluster(), _kube_docs(RAYJOB)
    args = _dockerfile_args()
    assert cluster["spec"]["rayVersion"] == args["RAY_VERSION"]
    assert cluster["spec"]["authOptions"]["mode"] == "token"
    assert job["spec"]["clusterSelector"]["ray.io/cluster"] == cluster["metadata"]["name"]
    head = cluster["spec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0"
    ports = {p["name"]: p["containerPort"] for p in head["template"]["spec"]["containers"][0]["ports"]}
    compose_head = _services()["ray-head"]["command"]
    assert ports["dashboard"] == int(_flag(compose_head, "--dashboard-port"))
    assert ports["gcs-server"] == int(_flag(compose_head, "--port"))
    for group in cluster["spec"]["workerGroupSpecs"]:
        limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert int(limits["nvidia.com/gpu"]) >= 1, group["groupName"]
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
    images = {c["image"] for pod in _pod_specs(cluster) for c in pod["containers"]}
    assert len(images) == 1, f"head and workers must run one image: {images}"
    for pod in _pod_specs(cluster):
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == int(args["UID"])


def test_kuberay_storage_is_shared_by_every_ray_pod() -> None:
    cluster, (job,) = _raycluster(), _kube_docs(RAYJOB)
    rwx_claims = {d["metadata"]["name"] for d in _kube_docs(RAYCLUSTER)
                  if d["kind"] == "PersistentVolumeClaim" and "ReadWriteMany" in d["spec"]["accessModes"]}
    storage = Path(_flag(shlex.split(job["spec"]["entrypoint"]), "--storage-path"))
    for pod in _pod_specs(cluster):
        claims = {v["name"]: v["persistentVolumeClaim"]["claimName"]
                  for v in pod["volumes"] if "persistentVolumeClaim" in v}
        (container,) = pod["containers"]
        volume_names = {v["name"] for v in pod["volumes"]}
        assert {m["name"] for m in container["volumeMounts"]} <= volume_names
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        on_rwx = [p for p, n in mounts.items() if storage.is_relative_to(p) and claims.get(n) in rwx_claims]
        assert on_rwx, f"{container['name']}: {storage} is not on a ReadWriteMany volume"
        hf_home = {e["name"]: e.get("value") for e in container["env"]}["HF_HOME"]
        assert claims.get(mounts.get(hf_home, "")) in rwx_claims, f"{container['name']}: HF_HOME not on a PVC"
        assert mounts.get("/dev/shm"), f"{container['name']}: Ray's object store needs a larger /dev/shm"


# --- docs -------------------------------------------------------------------------------------------


def test_docs_tunnel_and_urls_use_the_published_ports() -> None:
    s = _services()
    published = {int(p.split(":")[1]) for name in ("mlflow", "ray-head", "optuna-dashboard")
                 for p in s[name]["ports"]}
    for doc in DOCS:
        text = doc.read_text()
        for local, remote in re.findall(r"-L (\d+):127\.0\.0\.1:(\d+)", text):
            assert local == remote and int(remote) in published, f"{doc.name}: tunnel to {remote}"
        for port in re.findall(r"http://127\.0\.0\.1:(\d+)", text):
            assert int(port) in published, f"{doc.name}: http://127.0.0.1:{port} is not a published port"
    text = (REPO / "docs" / "cluster.md").read_text()
    assert "~/.ray/auth_token" in text and "RAY_AUTH_TOKEN" in text and "RAY_AUTH_MODE=token" in text
    assert re.search(r"<storage-path>/<name>/optuna\.db", text)
