"""Images without a registry: `<registry>/rlrun-<component>:<tag>` is Dockerfiles/<component>.Dockerfile,
whose final stage says how its container starts (ENTRYPOINT, CMD, WORKDIR, ENV, USER) and which
files of the repository it holds (COPY). The program itself runs from the venv of the checkout
the agent runs from, in place of the image's /opt/rlrun."""

from __future__ import annotations

import posixpath
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from dockerfile import exec_form, stages

IMAGE = re.compile(r"^(?:[^/]+/)*rlrun-(?P<component>[a-z0-9-]+)(?::[\w.-]+)?(?:@sha256:[0-9a-f]{64})?$")
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""Docker's PATH for an image whose base sets none of its own."""
_VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


class ImageError(ValueError):
    """An image the agent cannot run; the pod shows it as its container's waiting message."""


@dataclass(frozen=True)
class User:
    """An account the image's RUN lines create (`useradd`): the container's /etc/passwd and
    /etc/group get it, as the image's do (kopf, for one, looks its user up)."""

    name: str
    uid: int
    gid: int
    home: str
    shell: str
    create_home: bool

    def passwd(self) -> str:
        return f"{self.name}:x:{self.uid}:{self.gid}::{self.home}:{self.shell}\n"

    def group(self) -> str:
        return f"{self.name}:x:{self.gid}:\n"


@dataclass(frozen=True)
class Image:
    name: str
    dockerfile: Path
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    workdir: str = "/"
    env: dict[str, str] = field(default_factory=dict)
    user: str | None = None
    copies: list[tuple[str, str]] = field(default_factory=list)
    """(path in the repository, path in the image) of each COPY from the build context."""
    users: list[User] = field(default_factory=list)

    def home(self, uid: int) -> str:
        """HOME as a runtime sets it: the user's home in the image's passwd, else / (root: /root)."""
        return next((u.home for u in self.users if u.uid == uid), "/root" if uid == 0 else "/")

    def uid_gid(self) -> tuple[int, int]:
        """USER as numbers (the images use `uid:gid`; a name would need the image's passwd)."""
        if self.user is None:
            return 0, 0
        uid, _, gid = self.user.partition(":")
        if not uid.isdigit() or (gid and not gid.isdigit()):
            raise ImageError(f"{self.dockerfile.name}: USER {self.user} is not numeric")
        return int(uid), int(gid or uid)


def resolve(image: str, repo: Path) -> Image:
    match = IMAGE.match(image)
    if match is None:
        raise ImageError(
            f"image {image!r} is not one of rlrun's: the node agent runs <registry>/rlrun-<component>:<tag> "
            "from Dockerfiles/<component>.Dockerfile and pulls nothing"
        )
    path = repo / "Dockerfiles" / f"{match['component']}.Dockerfile"
    if not path.exists():
        raise ImageError(f"image {image!r}: {path.relative_to(repo)} does not exist")
    return _final_stage(image, path)


def _final_stage(image: str, path: Path) -> Image:
    entrypoint: list[str] = []
    cmd: list[str] = []
    workdir = "/"
    env = {"PATH": BASE_PATH}
    user = None
    copies: list[tuple[str, str]] = []
    users: list[User] = []
    for keyword, rest in stages(path)[-1]:
        if keyword == "ENTRYPOINT":
            entrypoint, cmd = exec_form(rest), []  # a new ENTRYPOINT resets CMD, as in Docker
        elif keyword == "CMD":
            cmd = exec_form(rest)
        elif keyword == "WORKDIR":
            workdir = posixpath.normpath(posixpath.join(workdir, _substitute(rest, env)))
        elif keyword == "ENV":
            env.update(_env(rest, env))
        elif keyword == "USER":
            user = _substitute(rest, env)
        elif keyword == "COPY":
            copies += _copies(rest, workdir)
        elif keyword == "RUN":
            users += _users(rest)
    return Image(image, path, entrypoint, cmd, workdir, env, user, copies, users)


def _substitute(text: str, env: dict[str, str]) -> str:
    return _VARIABLE.sub(lambda m: env.get(m[1] or m[2], ""), text)


def _env(rest: str, env: dict[str, str]) -> dict[str, str]:
    words = shlex.split(rest)
    if words and "=" not in words[0]:  # the legacy `ENV KEY value` form
        return {words[0]: _substitute(" ".join(words[1:]), env)}
    # Every value of one ENV line sees the variables as they were before the line.
    return {key: _substitute(value, env) for key, _, value in (word.partition("=") for word in words)}


def _copies(rest: str, workdir: str) -> list[tuple[str, str]]:
    words = shlex.split(rest)
    if any(word.startswith("--from") for word in words):
        return []  # the build stage's venv: the checkout's venv takes its place
    *sources, target = [word for word in words if not word.startswith("--")]
    target_dir = posixpath.normpath(posixpath.join(workdir, target))
    if len(sources) == 1 and not target.endswith("/"):
        return [(sources[0], target_dir)]
    return [(source, posixpath.join(target_dir, posixpath.basename(source))) for source in sources]


def _users(command: str) -> list[User]:
    """The accounts `useradd` creates in a RUN line (numeric --uid; --user-group or --gid)."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token in ("&&", "||", ";", "|"):
            commands.append([])
        else:
            commands[-1].append(token)
    return [_useradd(words[1:]) for words in commands if words and words[0] == "useradd"]


def _useradd(words: list[str]) -> User:
    names = {"-u": "--uid", "-g": "--gid", "-d": "--home-dir", "-s": "--shell"}
    options: dict[str, str] = {}
    flags: set[str] = set()
    positional = []
    remaining = iter(words)
    for word in remaining:
        word = names.get(word, word)
        if word in names.values():
            options[word] = next(remaining)
        elif word.startswith("-"):
            flags.add(word)
        else:
            positional.append(word)
    name = positional[-1]
    uid = int(options.get("--uid", "1000"))
    return User(
        name=name,
        uid=uid,
        gid=int(options.get("--gid", uid)),
        home=options.get("--home-dir", f"/home/{name}"),
        shell=options.get("--shell", "/bin/sh"),
        create_home=bool(flags & {"--create-home", "-m"}),
    )
