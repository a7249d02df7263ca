"""The command lines of ``tensorfs hash``, ``stats`` and ``diff`` (docs/reference/cli.md), and
their exit statuses: ``hash`` and ``stats`` exit 1 on any failure, ``diff`` 2 (0 and 1 say
whether the models differ, as diff(1)'s do).  ``tensorfs.cli.parser`` registers them here, so that
it imports none of their work (numpy) for its other commands."""

from __future__ import annotations

import argparse
import os

from tensorfs.errors import ModelError

COMMANDS = ("hash", "stats", "diff")


def add_commands(sub, model_help: str, debug_help: str, remote_options) -> None:
    """The three subparsers; ``remote_options(parser)`` adds what a URL takes."""
    hashing = sub.add_parser(
        "hash", help="per-tensor and whole-model hashes, as llama-gguf-hash prints them",
        description="Hash every tensor's stored bytes and the whole model's, in llama.cpp's "
        "llama-gguf-hash format (docs/reference/facts.md).  MODEL is " + model_help + ".")
    hashing.add_argument("model", metavar="MODEL", help=model_help)
    for name, what in (("xxh64", "xxh64 (the default)"), ("sha1", "sha1"),
                       ("sha256", "sha256"), ("uuid", "the model's UUIDv5 (llama.cpp's namespace)")):
        hashing.add_argument(f"--{name}", action="store_true", help=f"print {what}")
    hashing.add_argument("--all", action="store_true", help="xxh64, sha1 and sha256")
    hashing.add_argument("--no-layer", action="store_true",
                         help="the whole-model lines only, no line per tensor")
    hashing.add_argument("--check", "-c", metavar="MANIFEST",
                         help="verify MODEL against a manifest written by tensorfs hash or "
                         "llama-gguf-hash: exit 0, or 1 naming the first mismatch")
    _common(hashing, debug_help, remote_options)

    stats = sub.add_parser(
        "stats", help="count, min, max, mean, std, absmax, NaN/Inf/zeros of each tensor",
        description="Statistics of each tensor's values (those of its .npy view), "
        "accumulated in float64 (docs/reference/facts.md).  MODEL is " + model_help + ".")
    stats.add_argument("model", metavar="MODEL", help=model_help)
    stats.add_argument("tensors", metavar="TENSOR", nargs="*",
                       help="only these tensors (by name)")
    _output_forms(stats)
    stats.add_argument("--plot", metavar="FILE",
                       help="also draw each tensor's absmax and std into FILE (a PNG; needs "
                       "tensorfs-fuse[plot])")
    _common(stats, debug_help, remote_options)

    diff = sub.add_parser(
        "diff", help="compare two models tensor by tensor (exit 0 identical, 1 different)",
        description="Compare A and B tensor by tensor name: only in one, shape or type "
        "differs, identical bytes, or how far the values are (max_abs_diff, nmse, "
        "cosine).  Exit 0 when identical, 1 when they differ, 2 on error (docs/reference/facts.md).  "
        "A and B are each " + model_help + ".")
    diff.add_argument("a", metavar="A", help="the first model (the reference of nmse)")
    diff.add_argument("b", metavar="B", help="the second model")
    _output_forms(diff)
    diff.add_argument("--plot", metavar="FILE",
                      help="also draw the nmse of each tensor per layer into FILE (a PNG; "
                      "needs tensorfs-fuse[plot])")
    _common(diff, debug_help, remote_options)


def _output_forms(parser) -> None:
    """--json or --tsv (one of them): stats' and diff's forms of the table."""
    form = parser.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="one JSON document")
    form.add_argument("--tsv", action="store_true",
                      help="tab-separated rows even on a terminal (the form on a pipe)")


def _common(parser, debug_help: str, remote_options) -> None:
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help=debug_help)
    remote_options(parser)


def usage_problem(args) -> str | None:
    """What is wrong with a command line argparse accepted, or None."""
    from tensorfs.sources.urls import option_problem  # at first use: start-up time

    models = [args.a, args.b] if args.command == "diff" else [args.model]
    return option_problem(models, storage_options=args.storage_options, timeout=args.timeout)


def main(args, say_error, debug: bool) -> int:
    """Run a fact command; its exit status.  A failure is said in one line by
    ``say_error`` (``tensorfs.cli.errors``'s) and exits 1, or 2 for ``diff``; a bad command line
    exits 2."""
    # The work runs in our own threads, one per core; OpenBLAS's threads (numpy.dot) would
    # fight them: a dot of 1 Mi float64 took 10 ms with them on a loaded 2-CPU machine,
    # 0.15 ms with one.  Only heard before numpy is first imported: tensorfs.facts.models
    # imports it (through tensorfs.api).
    for variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(variable, "1")
    from tensorfs.facts.models import FactsError  # numpy: after the variables above

    problem = usage_problem(args)
    if problem is not None:
        say_error(problem)
        return 2
    try:
        return _run(args)
    except (FactsError, ModelError, OSError) as error:
        if debug or isinstance(error, BrokenPipeError):
            raise
        say_error(error)
        return 2 if args.command == "diff" else 1
    except Exception as error:
        if debug or args.command != "diff":
            raise                       # the CLI's own "internal error" line, exit 1
        say_error(f"internal error: {type(error).__name__}: {error}")
        return 2


def _run(args) -> int:
    # each command's module at its run: numpy after the variables main sets, and the
    # parser built without any of them (start-up time)
    if args.command == "hash":
        from tensorfs.facts import hashing

        return hashing.run(args)
    if args.command == "stats":
        from tensorfs.facts import stats

        return stats.run(args)
    from tensorfs.facts import diff

    return diff.run(args)
