"""A container's start, run as `python -I -S rootfs.py SPEC STATUS_FD` in the pod's network, UTS
and IPC namespaces (the agent enters them with nsenter). It unshares a mount and a PID
namespace and forks: the child is PID 1 of the container's PID namespace, builds the
container's root filesystem and execs the container's command, which stays PID 1, as in a
container runtime; the parent waits for it and exits as it does (the exit status, or the same
signal), ignoring SIGTERM and SIGINT, which reach the child through the process group. The
child dies with the parent (PR_SET_PDEATHSIG), and every process of the container with the
child.

The container's root:
- every host filesystem is overlaid (copy-on-write) with an upper layer on a tmpfs of this
  mount namespace, so a container may create its mount points (/etc/rlrun, /app, /data) and
  write anywhere outside its volumes without touching the host: the tmpfs, the overlays and
  every mount here vanish with the namespace when the container's last process exits;
- a fresh /proc for the container's PID namespace, the host's /sys and /dev, and a private
  /dev/shm;
- the image's files (its COPY lines: the repository's own files, read-only), then the pod's
  volumes at their mountPath (readOnly, subPath: the agent resolves the source), then the pod's
  /etc/hosts, /etc/hostname and /etc/resolv.conf, as kubelet mounts them;
- readOnlyRootFilesystem remounts the overlays read-only; the command then runs chrooted, in
  workingDir, as the pod's user and groups.

Standard library only, and no site packages (`-S`), so that a container starts fast. Whatever
fails before the exec is written to STATUS_FD, which only the child holds and the exec closes:
the agent reads EOF as "started" and a message as a StartError."""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
CLONE_NEWNS, CLONE_NEWPID = 0x00020000, 0x20000000
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
PSEUDO = ("/proc", "/sys", "/dev")
"""Host filesystems that are not overlaid: /proc is mounted anew, /sys and /dev are bound."""

_libc = ctypes.CDLL(None, use_errno=True)


def _bytes(value: str | None) -> bytes | None:
    return None if value is None else value.encode()


def mount(
    source: str | None, target: str, fstype: str | None, flags: int = 0, data: str | None = None
) -> None:
    if _libc.mount(_bytes(source), _bytes(target), _bytes(fstype), flags, _bytes(data)) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"mount {fstype or 'bind'} {source} on {target}: {os.strerror(error)}")


def _unescape(path: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for code in ("\\040", "\\011", "\\012", "\\134"):
        path = path.replace(code, chr(int(code[1:], 8)))
    return path


def host_filesystems() -> list[str]:
    """Mount points of the host's filesystems to overlay: / and the others outside /proc, /sys and
    /dev, parents before children."""
    points = []
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            point = _unescape(line.split()[4])
            if any(point == p or point.startswith(p + "/") for p in PSEUDO) or point in points:
                continue
            points.append(point)
    return sorted(points, key=lambda p: (p != "/", p.count("/"), p))


def inside(root: str, path: str) -> str:
    """`path` in the container's root `root`, following symlinks as the container would see them
    (an absolute link target is relative to `root`, `..` stops at it)."""
    pending = [p for p in path.split("/") if p and p != "."]
    resolved: list[str] = []
    hops = 0
    while pending:
        part = pending.pop(0)
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        candidate = os.path.join(root, *resolved, part)
        if os.path.islink(candidate):
            hops += 1
            if hops > 40:
                raise OSError(f"too many levels of symbolic links in {path}")
            target = os.readlink(candidate)
            if target.startswith("/"):
                resolved = []
            pending = [p for p in target.split("/") if p and p != "."] + pending
            continue
        resolved.append(part)
    return os.path.join(root, *resolved)


def mount_point(root: str, target: str, directory: bool) -> str:
    """The host path of `target` in the container, created (in the overlay) when missing."""
    path = inside(root, target)
    if os.path.lexists(path):
        return path
    for pseudo in PSEUDO:
        if path.startswith(os.path.join(root, pseudo.lstrip("/")) + "/"):
            raise OSError(f"mount point {target} would be created in the host's {pseudo}")
    if directory:
        os.makedirs(path)
    else:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "a").close()
    return path


def bind(source: str, target: str, read_only: bool) -> None:
    mount(source, target, None, MS_BIND | MS_REC)
    if read_only:
        mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY)


def build_root(spec: dict) -> list[str]:
    """Mounts the container's root at spec["rootfs"]; returns the overlays' mount points."""
    root, scratch = spec["rootfs"], spec["scratch"]
    filesystems = host_filesystems()  # before the scratch tmpfs below is one of them
    mount("tmpfs", scratch, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0700")
    overlays = []
    for index, point in enumerate(filesystems):
        upper, work = os.path.join(scratch, str(index), "upper"), os.path.join(scratch, str(index), "work")
        os.makedirs(upper)
        os.makedirs(work)
        target = root if point == "/" else os.path.join(root, point.lstrip("/"))
        if not os.path.isdir(target):
            continue  # a file bind-mounted on the host; the container's view keeps the file beneath
        options = f"lowerdir={point.replace(',', chr(92) + ',')},upperdir={upper},workdir={work}"
        try:
            mount("overlay", target, "overlay", 0, options)
        except OSError:
            if point == "/":
                raise
            bind(point, target, True)  # a filesystem overlayfs cannot sit on: read-only instead
        overlays.append(target)
    mount("proc", os.path.join(root, "proc"), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for pseudo in ("/sys", "/dev"):
        mount(pseudo, os.path.join(root, pseudo.lstrip("/")), None, MS_BIND | MS_REC)
    mount("tmpfs", os.path.join(root, "dev/shm"), "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    return overlays


def add_users(root: str, users: list[dict]) -> None:
    """The image's accounts, in the container's copy of /etc/passwd and /etc/group."""
    for user in users:
        with open(inside(root, "/etc/passwd")) as passwd:
            known = [line.split(":") for line in passwd]
        if any(fields[0] == user["name"] or fields[2] == str(user["uid"]) for fields in known):
            continue
        with open(inside(root, "/etc/passwd"), "a") as passwd:
            passwd.write(user["passwd"])
        with open(inside(root, "/etc/group"), "a") as group:
            group.write(user["group"])
        if user["create_home"]:
            home = mount_point(root, user["home"], True)
            os.chown(home, user["uid"], user["gid"])
            os.chmod(home, 0o700)


def mount_all(spec: dict) -> None:
    root = spec["rootfs"]
    overlays = build_root(spec)
    for each in spec["mounts"]:
        target = mount_point(root, each["target"], os.path.isdir(each["source"]))
        bind(each["source"], target, each["readOnly"])
    add_users(root, spec["users"])
    workdir = mount_point(root, spec["workdir"], True)
    if spec["uid"] != 0:
        # The venv's interpreter may sit under a directory only root may enter (/root is 0700):
        # the container's copy of each such directory gains o+x (the host's keeps its mode).
        for path in spec["traverse"]:
            path = inside(root, path)
            mode = os.stat(path).st_mode
            if not mode & 0o001:
                os.chmod(path, (mode & 0o7777) | 0o001)
    if spec["readOnlyRoot"]:
        for target in overlays:
            mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
    os.chroot(root)
    os.chdir(workdir[len(root) :] or "/")


def drop_privileges(spec: dict) -> None:
    os.setgroups(spec["groups"])
    os.setgid(spec["gid"])
    os.setuid(spec["uid"])
    if spec["noNewPrivileges"] and _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")


def fail(status_fd: int, message: str) -> None:
    os.write(status_fd, message.encode())
    print(f"rlrun node agent: the container did not start: {message}", file=sys.stderr, flush=True)
    os._exit(128)


def wait_for(child: int) -> None:
    """The parent's part: exit as the container's PID 1 does."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    _, status = os.waitpid(child, 0)
    if os.WIFSIGNALED(status):
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(status))
    os._exit(os.waitstatus_to_exitcode(status))


def main() -> None:
    spec_path, status_fd = sys.argv[1], int(sys.argv[2])
    with open(spec_path) as f:
        spec = json.load(f)
    if _libc.unshare(CLONE_NEWNS | CLONE_NEWPID) != 0:
        fail(status_fd, f"unshare: {os.strerror(ctypes.get_errno())}")
    # The parent holds `alive` open until it exits: the child, outside whose PID namespace the
    # parent is, learns that way whether the parent died before PR_SET_PDEATHSIG was set.
    alive, holder = os.pipe()
    child = os.fork()
    if child:
        os.close(status_fd)
        wait_for(child)
    os.close(holder)
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if select.select([alive], [], [], 0)[0]:
        os._exit(137)
    os.close(alive)
    os.set_inheritable(status_fd, False)  # closed by the exec: EOF tells the agent it started
    try:
        mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing mounted here reaches the host
        mount_all(spec)
        drop_privileges(spec)
    except OSError as error:
        fail(status_fd, str(error))
    # Python ignores SIGPIPE and SIGXFSZ; an ignored signal would stay ignored in the command.
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_DFL)
    command = spec["argv"][0]
    try:
        os.execvpe(command, spec["argv"], spec["env"])
    except OSError as error:
        if isinstance(error, FileNotFoundError) and "/" not in command:
            fail(status_fd, f'exec: "{command}": executable file not found in $PATH')
        fail(status_fd, f'exec: "{command}": {error.strerror}')


if __name__ == "__main__":
    main()
