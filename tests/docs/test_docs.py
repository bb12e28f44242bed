"""The docs cannot rot: every command is run, or mapped to the test that runs it, or exempt.

``rules.py`` says what happens to each shell command of README.md, CONTRIBUTING.md and
``docs/*.md``. Besides the commands: YAML blocks parse and the objects in them are valid, links
between the files resolve, the README starts as the project requires, user-facing text never says
"the seed", the examples use the chart's DeviceClasses, and the metrics tables name what the
components export.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.docs import rules
from tests.docs.markdown import DOCS, REPO, Command, anchors, blocks, commands, links
from tests.kube_validate import assert_valid

ALL: list[Command] = [command for doc in DOCS for command in commands(doc)]
EXAMPLES = REPO / "api" / "examples"
CHART = REPO / "charts" / "hami-dra"
#: Words of the worked example that user-facing text must not replace with the project's jargon.
SEED = re.compile(r"\bthe seed\b|\bseed's\b", re.IGNORECASE)


def normalized(text: str) -> str:
    """The command as the rules match it: no ``sudo``, no ``.venv/bin/`` before a program."""
    text = re.sub(r"^sudo\s+", "", text)
    return re.sub(r"(^|\s)\.venv/bin/", r"\1", text)


def _matches(text: str, prefix: str) -> bool:
    """A prefix ending in a space or ``/`` matches any continuation; otherwise whole words only."""
    if prefix.endswith((" ", "/")):
        return text.startswith(prefix)
    return text == prefix or text.startswith(prefix + " ")


def rule(command: Command) -> tuple[str, str, str] | None:
    """(table, prefix, value) of the longest prefix that matches the command, or None."""
    text = normalized(command.text)
    tables = (("RUN", rules.RUN), ("TESTED", rules.TESTED), ("EXEMPT", rules.EXEMPT))
    matches = [
        (len(prefix), table, prefix, value)
        for table, entries in tables
        for prefix, value in entries.items()
        if _matches(text, prefix)
    ]
    if not matches:
        return None
    _, table, prefix, value = max(matches)
    return table, prefix, value


def _id(command: Command) -> str:
    return command.where


def of_runner(runner: str) -> list[Command]:
    found = []
    for command in ALL:
        match = rule(command)
        if match and match[0] == "RUN" and match[2] == runner:
            found.append(command)
    return found


# -- the rules cover every command, and only commands that exist -----------------------------------


def test_every_command_is_run_tested_or_exempt() -> None:
    unmatched = [f"{c.where}: {c.text}" for c in ALL if rule(c) is None]
    assert not unmatched, (
        "commands in the docs that no test runs: add each to RUN, TESTED or EXEMPT in tests/docs/rules.py\n  "
        + "\n  ".join(unmatched)
    )


def test_every_rule_matches_a_command() -> None:
    used = {(match[0], match[1]) for match in map(rule, ALL) if match}
    tables = {"RUN": rules.RUN, "TESTED": rules.TESTED, "EXEMPT": rules.EXEMPT}
    stale = [
        f"{table}[{prefix!r}]"
        for table, entries in tables.items()
        for prefix in entries
        if (table, prefix) not in used
    ]
    stale += [
        f"EXPECT[{p!r}]" for p in rules.EXPECT if not any(normalized(c.text).startswith(p) for c in ALL)
    ]
    assert not stale, f"rules that match no command of the docs any more: {stale}"


def _defined(path: Path, names: list[str]) -> bool:
    body: list[ast.stmt] = ast.parse(path.read_text()).body
    for name in names:
        node = next(
            (n for n in body if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name == name), None
        )
        if node is None:
            return False
        body = node.body if isinstance(node, ast.ClassDef) else []
    return True


@pytest.mark.parametrize("node_id", sorted(set(rules.TESTED.values())))
def test_the_mapped_test_exists(node_id: str) -> None:
    file, *names = node_id.split("::")
    path = REPO / file
    assert path.is_file(), f"{node_id}: no such file"
    assert names and _defined(path, [name.split("[")[0] for name in names]), f"{node_id}: no such test"


# -- checks every command gets, whatever its rule --------------------------------------------------

_PATH = re.compile(r"^(?:\./)?((?:api|charts|docs|examples|hack|tests|dra_driver)/[\w./-]*)")


def _hami_dra_argv(words: list[str]) -> list[str] | None:
    for start in range(len(words)):
        if words[start] == "hami-dra" and (start == 0 or words[start - 1] in {"kubectl", "sudo"}):
            return words[start + 1 :]
    return None


def _parse_cli(argv: list[str]) -> None:
    from dra_driver.cli import build_parser

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        try:
            build_parser().parse_args(argv)
        except SystemExit as exit_:
            assert exit_.code == 0, f"hami-dra {' '.join(argv)}: {err.getvalue().strip()}"


@pytest.mark.parametrize("command", ALL, ids=_id)
def test_command_is_sound(command: Command, request: pytest.FixtureRequest) -> None:
    """Its paths exist, hami-dra parses it, make knows the target, applied files are valid."""
    words = shlex.split(normalized(command.text))
    for word in words:
        for part in word.split("="):
            match = _PATH.match(part)
            if match:
                assert (REPO / match.group(1)).exists(), f"{command.where}: {match.group(1)} does not exist"
    argv = _hami_dra_argv(words)
    if argv is not None:
        _parse_cli(argv)
    if words[0] == "make":
        proc = subprocess.run(
            ["make", "-n", *words[1:]], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
        )
        assert proc.returncode == 0, f"{command.where}: make -n {' '.join(words[1:])}: {proc.stderr}"
    if words[:2] == ["kubectl", "apply"]:
        assert_applicable(REPO / words[words.index("-f") + 1], request.getfixturevalue("chart_classes"))


# -- the examples ----------------------------------------------------------------------------------

#: Kinds an example may hold: what a user creates, never what the chart owns.
USER_KINDS = frozenset({"Pod", "ResourceClaim", "ResourceClaimTemplate", "Deployment", "Job", "GpuQuota"})


def _class_names(obj: Any) -> Iterator[str]:
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key == "deviceClassName":
                yield str(value)
            else:
                yield from _class_names(value)
    elif isinstance(obj, list):
        for item in obj:
            yield from _class_names(item)


def assert_applicable(path: Path, chart_classes: set[str]) -> None:
    """``kubectl apply -f path`` would be accepted and uses only classes the chart installs."""
    objects = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    assert objects, f"{path.relative_to(REPO)} holds no object"
    for obj in objects:
        kind = obj.get("kind")
        assert kind in USER_KINDS, (
            f"{path.relative_to(REPO)}: {kind} {obj['metadata'].get('name')}: examples never declare objects "
            "the chart owns (kubectl delete -f would remove them); use the chart's"
        )
        assert_valid(obj)
        missing = set(_class_names(obj)) - chart_classes
        assert not missing, f"{path.relative_to(REPO)}: DeviceClasses the chart does not install: {missing}"


@pytest.mark.parametrize("path", sorted(EXAMPLES.rglob("*.yaml")), ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_examples_use_the_charts_classes(path: Path, chart_classes: set[str]) -> None:
    assert_applicable(path, chart_classes)


# -- commands run here -----------------------------------------------------------------------------


def run_hami_dra(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``hami-dra argv`` in this process (the CLI's imports are paid once, not per command)."""
    from dra_driver.cli import main

    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def run_shell(text: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    path = os.pathsep.join([str(REPO / ".venv" / "bin"), str(REPO / ".tools" / "bin"), os.environ["PATH"]])
    proc = subprocess.run(
        ["bash", "-o", "pipefail", "-c", text],
        cwd=REPO,
        env={**os.environ, "PATH": path, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return proc.returncode, proc.stdout + proc.stderr


def run_command(
    text: str, capsys: pytest.CaptureFixture[str], env: dict[str, str] | None = None
) -> tuple[int, str]:
    words = shlex.split(normalized(text))
    argv = _hami_dra_argv(words)
    if argv is not None and not any(word in {"|", "&&", ";"} for word in words):
        return run_hami_dra(argv, capsys)
    return run_shell(normalized(text), env)


def expected(text: str) -> str | None:
    matches = [prefix for prefix in rules.EXPECT if normalized(text).startswith(prefix)]
    return rules.EXPECT[max(matches, key=len)] if matches else None


@pytest.mark.parametrize("command", of_runner("here"), ids=_id)
def test_runs_here(
    command: Command, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", "/nonexistent")  # nothing here may need a cluster
    code, out = run_command(command.text, capsys)
    assert code == 0, f"{command.where}: {command.text}\n{out}"
    want = expected(command.text)
    assert want is None or want in out, f"{command.where}: {command.text}: {want!r} not in\n{out}"


#: The released chart (make release pushes it) is the checkout's with the same image default.
RELEASED_CHART = "oci://ghcr.io/hami-dra/charts/hami-dra"


def helm_template_args(words: list[str]) -> list[str]:
    """``helm install|upgrade NAME CHART flags`` as ``helm template`` arguments; the released
    chart is rendered from the checkout (no registry here), without its ``--version``."""
    assert words[0] == "helm" and words[1] in {"install", "upgrade"}, words
    chart = "charts/hami-dra" if words[3] == RELEASED_CHART else words[3]
    args = ["template", words[2], chart]
    rest = iter(words[4:])
    for word in rest:
        if word in {"--wait", "--atomic", "--reuse-values", "--install"}:
            continue
        if word == "--timeout" or (word == "--version" and chart != words[3]):
            next(rest)
            continue
        args.append(word)
    return args


@pytest.mark.parametrize("command", of_runner("helm"), ids=_id)
def test_helm_commands_render(command: Command, helm: str) -> None:
    args = helm_template_args(shlex.split(command.text))
    proc = subprocess.run([helm, *args], cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, f"{command.where}: helm {' '.join(args)}: {proc.stderr}"
    kinds = {doc["kind"] for doc in yaml.safe_load_all(proc.stdout) if doc}
    assert {"DaemonSet", "Deployment", "DeviceClass"} <= kinds, (
        f"{command.where}: rendered only {sorted(kinds)}"
    )
    for word in shlex.split(command.text):
        if word.startswith("image.repository="):
            assert word.split("=", 1)[1] in proc.stdout


# -- commands run on the lab -----------------------------------------------------------------------


def _gpu_pods_settled(api_client: Any, namespace: str, names: list[str]) -> Callable[[], bool]:
    from kubernetes import client

    core = client.CoreV1Api(api_client)

    def settled() -> bool:
        for name in names:
            pod = core.read_namespaced_pod(name, namespace)
            gated = any(g.name == "gpu.hami.io/allocation" for g in pod.spec.scheduling_gates or ())
            decided = any(c.type == "gpu.hami.io/Allocated" for c in pod.status.conditions or ())
            if gated and not decided:
                return False
        return True

    return settled


def test_lab_walkthrough(
    helm: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The lab commands of every document, in order, against the driver on a sandbox cluster."""
    from hami_dra_dev.demo.stack import DemoStack

    lab = of_runner("lab")
    assert lab
    classes = subprocess.run(
        [helm, "template", "hami-dra", str(CHART), "--show-only", "templates/deviceclasses.yaml"],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    with DemoStack.start() as stack:
        env = {"KUBECONFIG": str(stack.kubeconfig), "KUBECACHEDIR": str(tmp_path / "kubectl-cache")}
        monkeypatch.setenv("KUBECONFIG", str(stack.kubeconfig))
        # The kubernetes client reads $KUBECONFIG once, at import; a CLI process starts with it set.
        monkeypatch.setattr(
            "kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION", str(stack.kubeconfig)
        )
        for setup in (f"kubectl apply -f - <<'EOF'\n{classes}\nEOF", "kubectl create namespace team-a"):
            code, out = run_shell(setup, env)
            assert code == 0, out
        for command in lab:
            text = command.text
            for placeholder, value in rules.PLACEHOLDERS.items():
                text = re.sub(rf"\b{placeholder}\b", value, text)
            code, out = run_command(text, capsys, env)
            assert code == 0, f"{command.where}: {text}\n{out}"
            want = expected(command.text)
            assert want is None or want in out, f"{command.where}: {text}: {want!r} not in\n{out}"
            words = shlex.split(text)
            if words[:2] == ["kubectl", "apply"]:
                path = REPO / words[words.index("-f") + 1]
                pods = [
                    d["metadata"]["name"]
                    for d in yaml.safe_load_all(path.read_text())
                    if d and d["kind"] == "Pod"
                ]
                settled = _gpu_pods_settled(stack.api_client, "default", pods)
                deadline = time.monotonic() + 30
                while not settled():
                    assert time.monotonic() < deadline, (
                        f"{command.where}: {pods} were not placed or refused in 30 s"
                    )
                    time.sleep(0.2)


# -- YAML blocks -----------------------------------------------------------------------------------

YAML_BLOCKS = [block for doc in DOCS for block in blocks(doc) if block.lang == "yaml"]


@pytest.mark.parametrize("block", YAML_BLOCKS, ids=lambda b: f"{b.doc.relative_to(REPO)}:{b.line}")
def test_yaml_blocks_are_valid(block: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    docs = [doc for doc in yaml.safe_load_all(block.text) if doc is not None]
    assert docs, "empty YAML block"
    for doc in docs:
        if isinstance(doc, dict) and "apiVersion" in doc and "kind" in doc:
            assert_valid(doc)
        elif isinstance(doc, dict) and {"nodes", "claims"} <= doc.keys():
            scenario = tmp_path / "scenario.yaml"
            scenario.write_text(block.text)
            code, out = run_hami_dra(["simulate", str(scenario)], capsys)
            assert code == 0, out


def test_json_blocks_are_json() -> None:
    for doc in DOCS:
        for block in blocks(doc):
            if block.lang == "json":
                json.loads(block.text)


# -- links, the README's start, words ----------------------------------------------------------------


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(REPO)))
def test_links_resolve(doc: Path) -> None:
    broken = []
    for line, target in links(doc):
        if re.match(r"^[a-z]+:", target):
            continue  # https:, mailto:
        file, _, anchor = target.partition("#")
        path = (doc.parent / file).resolve() if file else doc
        if not path.exists():
            broken.append(f"{line}: {target} (no such file)")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{line}: {target} (no heading #{anchor} in {path.relative_to(REPO)})")
    assert not broken, f"{doc.relative_to(REPO)}:\n  " + "\n  ".join(broken)


def test_readme_starts_with_the_two_setup_commands() -> None:
    """Project rule: the README starts with exactly two set-up commands, make demo and make test."""
    text = (REPO / "README.md").read_text()
    first = blocks(REPO / "README.md")[0]
    assert first.line <= 4, "the README's first block must come right after its title"
    assert [normalized(c.text) for c in commands(REPO / "README.md")[:2]] == ["make demo", "make test"]
    assert [line for line in first.text.splitlines() if line.strip()] == [
        line for line in first.text.splitlines() if line.startswith(("make demo ", "make test "))
    ], "the first block holds the two commands and nothing else"
    screen = "\n".join(text.splitlines()[:40])
    for word in ("NVIDIA", "HAMi", "DRA", "make demo"):
        assert word in screen, f"the README's first screen should say {word!r}"
    for developer in ("pytest", "mypy", "ruff", "apt-get"):
        assert developer not in screen, (
            f"{developer!r} on the README's first screen: developer material goes to CONTRIBUTING.md"
        )


USER_FACING = [
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    *(CHART / name for name in ("README.md", "values.yaml", "values-local.yaml", "templates/NOTES.txt")),
    *sorted((REPO / "examples").rglob("*.yaml")),
    *sorted(EXAMPLES.glob("*.yaml")),
]


@pytest.mark.parametrize("doc", USER_FACING, ids=lambda d: str(d.relative_to(REPO)))
def test_user_docs_say_worked_example_not_seed(doc: Path) -> None:
    hits = [
        f"{n}: {line.strip()}" for n, line in enumerate(doc.read_text().splitlines(), 1) if SEED.search(line)
    ]
    assert not hits, (
        f"{doc.relative_to(REPO)}: say 'the worked example' or 'the 4 x T4 lab':\n  " + "\n  ".join(hits)
    )


def test_cli_help_says_worked_example_not_seed() -> None:
    from dra_driver.cli import build_parser

    def helps(parser: Any) -> Iterator[tuple[str, str]]:
        yield parser.prog, parser.format_help()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    yield from helps(sub)

    hits = [
        f"{prog}: {line.strip()}"
        for prog, text in helps(build_parser())
        for line in text.splitlines()
        if SEED.search(line)
    ]
    assert not hits, "say 'the worked example' or 'the 4 x T4 lab':\n  " + "\n  ".join(hits)


# -- metrics -----------------------------------------------------------------------------------------


def _exported() -> dict[str, str]:
    """Sample names each component exports -> its family's type."""
    from dra_driver.controller.metrics import ControllerMetrics
    from dra_driver.kubeletplugin.metrics import PluginMetrics
    from dra_driver.webhook.metrics import WebhookMetrics

    webhook = WebhookMetrics()
    webhook.watch_connections(lambda reason: 0, lambda: 0)
    names: dict[str, str] = {}
    for registry in (ControllerMetrics().registry, PluginMetrics().registry, webhook.registry):
        for family in registry.collect():
            suffixes = {"counter": ["_total"], "histogram": ["", "_bucket", "_sum", "_count"]}.get(
                family.type, [""]
            )
            for suffix in suffixes:
                names[family.name + suffix] = family.type
    return names


def test_documented_metrics_are_exported_and_every_family_is_documented() -> None:
    text = "\n".join(doc.read_text() for doc in DOCS)
    # ``hami_dra_dev`` is the development package (dev/), not a metric.
    documented = set(re.findall(r"\bhami_dra_[a-z0-9_]*[a-z0-9]", text)) - {"hami_dra_dev"}
    exported = _exported()
    unknown = sorted(name for name in documented if name not in exported)
    assert not unknown, (
        f"metric names in the docs that no component exports (counters end in _total): {unknown}"
    )
    table = (REPO / "docs" / "monitoring.md").read_text()
    families = {name for name, kind in exported.items() if not name.endswith(("_bucket", "_sum", "_count"))}
    missing = sorted(name for name in families if f"`{name}`" not in table)
    assert not missing, f"exported metrics missing from docs/monitoring.md: {missing}"


# -- fixtures ----------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def helm() -> str:
    from tests.chart.helpers import find_or_install_helm

    path, why = find_or_install_helm()
    if path is None:
        pytest.skip(f"helm is not installed and hack/install.d/helm.sh could not install it: {why}")
    return path


@pytest.fixture(scope="session")
def chart_classes(helm: str) -> set[str]:
    out = subprocess.run(
        [helm, "template", "hami-dra", str(CHART), "--show-only", "templates/deviceclasses.yaml"],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    names = {
        doc["metadata"]["name"] for doc in yaml.safe_load_all(out) if doc and doc["kind"] == "DeviceClass"
    }
    assert "gpu.hami.io" in names
    return names
