"""Mount as root in one process, serve unprivileged in another: a /dev/fuse descriptor passed
over a unix socket (docs/guide/containers.md).

    python fdpass.py mount DIR SOCKET [UID]      # privileged: when the server connects, open
                                                 # /dev/fuse, mount(2) it at DIR for UID, send
                                                 # the descriptor, wait
    python fdpass.py serve SOCKET -- tensorfs mount MODEL   # unprivileged: receive it, run
                                                 # the command with /dev/fd/N appended

The mounter keeps running until the mount is gone from its mount table, so that it can be
the one that unmounts (umount DIR) when it is told to stop (SIGTERM).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys
import time

MS_NOSUID, MS_NODEV, MS_RDONLY = 2, 4, 1
MNT_DETACH = 2


def mount(directory: str, path: str, uid: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)
        os.chown(path, uid, -1)
        server.listen(1)
        print("listening", flush=True)
        connection, _ = server.accept()
        with connection:                # mounted when the server asks: its descriptor
            fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
            data = f"fd={fd},rootmode=40000,user_id={uid},group_id={uid},allow_other"
            if libc.mount(b"tensorfs", os.fsencode(directory), b"fuse.tensorfs",
                          MS_NOSUID | MS_NODEV | MS_RDONLY, data.encode()) != 0:
                raise OSError(ctypes.get_errno(), f"mount {directory}")
            socket.send_fds(connection, [b"fd"], [fd])
    os.close(fd)                                    # the server holds it now

    def stop(*_):
        libc.umount2(os.fsencode(directory), MNT_DETACH)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    real = os.path.realpath(directory)
    while True:
        with open("/proc/self/mountinfo") as table:
            if not any(line.split()[4] == real for line in table):
                break
        time.sleep(0.5)
    return 0


def serve(path: str, command: list[str]) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.connect(path)
        _, fds, _, _ = socket.recv_fds(client, 16, 1)
    os.set_inheritable(fds[0], True)
    os.execvp(command[0], command + [f"/dev/fd/{fds[0]}"])


if __name__ == "__main__":
    if sys.argv[1] == "mount":
        sys.exit(mount(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 0))
    serve(sys.argv[2], sys.argv[sys.argv.index("--") + 1:])
