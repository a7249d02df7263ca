"""``python -m tensorfs.transports.helper``: the process that runs obstore for a process that
will fork (``tensorfs.transports.objects``, "where obstore runs")."""

from tensorfs.transports.objects import helper_main

if __name__ == "__main__":
    helper_main()
