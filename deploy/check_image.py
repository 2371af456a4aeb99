"""Checks deploy/Dockerfile without a Docker engine: the image ships the
server and respcoordctl, and the build context that
deploy/Dockerfile.dockerignore leaves holds a workspace cargo can load with
both binaries.

    python3 deploy/check_image.py WORKDIR

1. The final stage copies /respcoord and /respcoordctl out of the build
   stage, and the build stage's RUN builds each of them (`--bin NAME`) and
   copies it to where the final stage takes it from; the entrypoint is the
   server.
2. The context: the repository's files (git's tracked and untracked ones,
   as a clean checkout has them) minus the .dockerignore patterns, copied to
   WORKDIR/context; `cargo metadata --no-deps --locked` there must load the
   workspace and find both binaries, and every target file the manifests
   declare must be there (cargo refuses to build without one), so a pattern
   that drops something the build needs fails here, not in a release
   pipeline.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

BINARIES = ("respcoord", "respcoordctl")


def fail(message: str) -> None:
    print(f"FAIL deploy/Dockerfile: {message}", file=sys.stderr)
    sys.exit(1)


def instructions(dockerfile: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", "\n".join(
        line for line in dockerfile.splitlines() if not line.lstrip().startswith("#")
    ))
    out = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def check_stages(dockerfile: str) -> None:
    stages: dict[str, list[tuple[str, str]]] = {}
    current = None
    for word, rest in instructions(dockerfile):
        if word == "FROM":
            name = rest.split()[-1] if " AS " in rest.upper() else f"stage{len(stages)}"
            current = stages.setdefault(name, [])
        elif current is not None:
            current.append((word, rest))
    if "build" not in stages:
        fail("no stage named 'build'")
    final = list(stages.values())[-1]
    copied: set[str] = set()
    for word, rest in final:
        if word == "COPY" and "--from=build" in rest:
            paths = [p for p in rest.split() if not p.startswith("--")]
            copied.update(Path(p).name for p in paths[:-1])
    build_runs = " ".join(rest for word, rest in stages["build"] if word == "RUN")
    for binary in BINARIES:
        if binary not in copied:
            fail(f"the final stage does not copy /{binary} from the build stage")
        if not re.search(rf"cargo build [^&]*--bin {binary}(\s|$)", build_runs):
            fail(f"the build stage does not build --bin {binary}")
        if f"target/release/{binary}" not in build_runs:
            fail(f"the build stage does not copy target/release/{binary} out")
    entrypoint = [rest for word, rest in final if word == "ENTRYPOINT"]
    if not entrypoint or json.loads(entrypoint[-1])[0] != "/respcoord":
        fail("the entrypoint is not /respcoord")


def ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: a pattern matches the path or one of its parent
    directories, relative to the context root; later `!` patterns re-include."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    result = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        if any(fnmatch.fnmatchcase(prefix, pattern) for prefix in prefixes):
            result = not negate
    return result


def check_context(repo: Path, work: Path) -> int:
    patterns = [
        line.strip()
        for line in (repo / "deploy/Dockerfile.dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=repo, check=True, capture_output=True,
    ).stdout.decode().split("\0")
    context = work / "context"
    shutil.rmtree(context, ignore_errors=True)
    kept = 0
    for name in files:
        if not name or ignored(name, patterns) or not (repo / name).is_file():
            continue
        target = context / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / name, target)
        kept += 1
    metadata = subprocess.run(
        ["cargo", "metadata", "--no-deps", "--locked", "--format-version", "1",
         "--manifest-path", str(context / "Cargo.toml")],
        capture_output=True, text=True,
    )
    if metadata.returncode != 0:
        fail(f"cargo cannot load the workspace from the build context:\n{metadata.stderr}")
    loaded = json.loads(metadata.stdout)
    members = set(loaded["workspace_members"])
    targets = [
        target
        for package in loaded["packages"]
        if package["id"] in members
        for target in package["targets"]
    ]
    # cargo refuses to build when a declared target's file is missing, even
    # one it would not build; metadata alone does not look.
    for target in targets:
        if not Path(target["src_path"]).is_file():
            missing = Path(target["src_path"]).relative_to(context)
            fail(f"the build context lacks {missing} ({target['name']}, a declared target)")
    # A declared target whose file is missing is dropped from the metadata
    # without a word; `cargo build` refuses the manifest instead.
    for package in loaded["packages"]:
        if package["id"] not in members:
            continue
        manifest = tomllib.loads(Path(package["manifest_path"]).read_text())
        found = {target["name"] for target in package["targets"]}
        for section in ("bin", "example", "test", "bench"):
            for declared in manifest.get(section, []):
                if declared["name"] not in found:
                    fail(
                        f"the build context lacks the file of {package['name']}'s "
                        f"declared {section} '{declared['name']}'"
                    )
    bins = {target["name"] for target in targets if "bin" in target["kind"]}
    for binary in BINARIES:
        if binary not in bins:
            fail(f"the build context's workspace has no binary {binary}")
    return kept


def main() -> None:
    repo = Path(__file__).resolve().parent.parent
    work = Path(sys.argv[1])
    check_stages((repo / "deploy/Dockerfile").read_text())
    kept = check_context(repo, work)
    print(
        "ok   deploy/Dockerfile: builds and ships " + " and ".join(BINARIES)
        + f"; its context ({kept} files after the .dockerignore) loads the workspace"
    )


if __name__ == "__main__":
    main()
