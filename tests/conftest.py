"""The suite's shared configuration: anyio backends, and markers and time limits by path.

Every async test runs on both anyio backends (asyncio and trio).

The markers (registered in pyproject.toml) are given here, by path, so test files need no
edits; ``make check`` leaves out all four, ``make test`` (and so CI) runs everything:

- ``adapters``: everything under tests/adapter_tests (the real transformers, torch and ray);
- ``browser``: the tests that start headless Chromium (through tests/_browser.py);
- ``crash``: the tests that SIGKILL processes;
- ``slow``: the tests that take more than a few seconds, and enough others that ``make
  check`` stays under a minute, from measured ``pytest --durations=0`` runs (see SLOW).

One marker's tests: ``.venv/bin/python -m pytest -m browser``; what it selects:
``... -m slow --collect-only -q``. The time limit of a test is pyproject's ``timeout``
(pytest-timeout) unless TIMEOUTS gives it more.

``make test`` runs the suite on two pytest-xdist workers (``-n 2 --dist loadfile``): each
file stays on one worker (its module fixtures are made once), the files of ``RAY_FILES`` on
one worker together, sharing one Ray cluster (``ray_cluster``), and the longest first
(``LONGEST``), so that both workers end about together.
"""

from __future__ import annotations

import os
import re
import signal
import sysconfig
from collections.abc import Generator, Iterable
from pathlib import Path
from typing import Any

import pytest
from _browser import in_ci

TESTS = os.path.dirname(os.path.abspath(__file__))

# Keys below are paths relative to tests/: a folder ("adapter_tests/"), a file
# ("test_docs.py"), or one test of a file, by its name without parameters
# ("test_docs.py::test_shell_commands_run_as_written_from_a_fresh_directory";
# "file::Class::test" for a method), or some of its parameters, ``*`` matching any text
# ("file::test[*-Ray *]"). tests/test_suite_markers.py checks that each names
# something that exists.

ADAPTERS = (
    "adapter_tests/",
    # The options' checks through the adapters (importing transformers and ray: 6 s).
    "test_options.py::test_every_way_in_refuses_a_hostile_number_of_seconds[*-Hugging Face *]",
    "test_options.py::test_every_way_in_refuses_a_hostile_number_of_seconds[*-Ray *]",
)

BROWSER = (
    "test_browser_harness.py",
    "test_report_browser.py",
    "test_report_cost_chart.py",
    "test_site_browser.py",
)

CRASH = (
    "reliability/test_crash_safety.py",
    "reliability/test_resume_equivalence.py",
    "reliability/test_pending_failures.py",
    "test_state_files.py::test_crash_during_rewrite_always_leaves_a_whole_snapshot",
    # SIGTERM to real processes, then a requeue on the same folder.
    "reliability/test_preemption.py",
    "test_run_folder_starts.py::test_a_process_killed_before_its_first_checkpoint_starts_again_as_it_was_run",
    "test_run_folder_starts.py::test_the_demo_killed_before_its_first_checkpoint_resumes_from_its_folder",
)

#: Measured on this project's machine (2 cores, shared with other test runs) with
#: ``--durations=0``, 2026-12-01: the files whose tests run commands or whole trainers in
#: subprocesses; single tests over about 1.5 s in a run of the whole suite; and those over about
#: 0.75 s in a run of ``make check``'s selection, so that it stays under a minute. The figures are
#: those runs', in seconds.
SLOW = (
    # Files.
    "test_log_header_refusal.py",  # 19: every log command on endless streams, subprocesses
    "test_run_folder_starts.py",  # 15: killed runs started again, subprocesses
    "test_docs.py",  # 76: the README's and docs' commands, from fresh directories
    "test_cli_log.py",  # 46: the log commands, each a subprocess
    "test_replay_costs_cli.py",  # 5: eventbus replay --cost, in subprocesses
    "test_examples.py",  # 45: the examples, Hugging Face's, Lightning's and torchrun's
    "test_cli_output_files.py",  # 42: every command's outputs, each a subprocess
    "test_benchmarks_run.py",  # 29: make bench-quick
    "reliability/test_adversarial.py",  # 29
    "reliability/test_faulty_callbacks.py",  # 24
    "test_api_reference.py",  # 13: mkdocs builds the site, the reference with it
    "test_site_browser.py",  # 48: every page of the site in Chromium, one browser a page
    "test_log_streams.py",  # 19: the log commands on pipes
    "test_cli_numbers.py",  # 15: 25 command lines
    "test_report_cli.py",  # 14: eventbus report
    "test_cli_streams.py",  # 11: every command with a closed stdout
    "test_log_history.py",  # 9: 80,000 resumes; the commands on a resumed run's log
    "reliability/test_damaged_input.py",  # 8: fuzzing the decoders
    "test_bench.py",  # 8: eventbus bench
    "test_bench_metrics.py",  # 14: eventbus bench, each a subprocess
    "test_bench_faults.py",  # 13
    "test_bench_builtins.py",  # 11
    "test_bench_instances.py",  # 5
    "adapter_tests/test_torchrun.py",  # 33: real torchrun jobs, two ranks each
    "test_bench_policies.py",  # 7: eventbus bench --over-budget, each run for seconds
    "test_replay_equals_live.py",  # 7: live runs that sleep, beside their replays
    "test_log_properties.py",  # 7: hypothesis over logs
    "reliability/test_soak.py",  # 6 (and much longer with --soak)
    "test_demo.py",  # 4: the demo trainer, in subprocesses
    "test_log_stats_costs.py",  # 10: eventbus stats, each a subprocess
    "test_resume_readme_flow.py",  # 4: the README's resume flow, in subprocesses
    "reliability/test_backpressure.py",  # 2: memory bounds under fast producers
    "test_typed_install.py",  # mypy on a user's file, and a wheel build
    "test_docs_typed.py",  # 15-32: mypy --strict and pyright over the docs' examples
    # Single tests, each with its figure on the line before.
    # 15
    "test_bus_properties.py::test_every_handler_gets_its_events_in_order_and_counts_add_up",
    # 3.3: imports ray
    "test_report_edges.py::test_the_ray_reporter_refuses_such_a_location_by_the_same_check",
    # 6: mypy in a subprocess
    "test_run_callbacks.py::test_mypy_catches_what_is_not_a_callback",
    # 6 and 5: pytest in a subprocess
    "test_replay.py::test_the_plugin_from_a_user_test",
    "test_replay.py::test_plugin_fixtures_fail_a_wrong_expectation",
    # 5: hypothesis
    "test_state_tampered.py::"
    "test_random_tampering_never_sets_undeclared_names_nor_costs_untampered_callbacks",
    # 4: six runs in subprocesses, interrupted
    "test_run_faults.py::test_sigint_ends_a_run_in_order_and_leaves_a_plain_keyboard_interrupt",
    # 2 each
    "test_state_files.py::"
    "test_two_writers_of_one_snapshot_never_delete_each_others_temporary_files",
    "reliability/test_hostile_options.py::"
    "test_a_hostile_option_is_refused_naming_it_or_the_run_ends_in_order",
    "test_bus_faults.py::test_a_handler_emitting_two_events_per_event_is_bounded_and_fails_visibly",
    "test_log_hostile.py::test_a_users_event_type_is_a_placeholder_naming_its_module",
    # 6: imports every module, torch and transformers included
    "test_layout.py::test_every_public_name_has_one_home",
    # 10, 1.4 and 0.5: they import every module, torch and transformers included (whichever
    # runs first pays for it)
    "test_error_messages.py::test_the_scan_sees_the_options_messages_name",
    "test_error_messages.py::test_every_option_a_message_names_exists",
    "test_error_messages.py::test_the_allow_list_holds_only_names_still_used_and_not_ours",
    # 3.4 (both backends)
    "test_run_faults.py::test_a_dict_nested_far_too_deep_is_refused_not_a_crash",
    # 1.8 and 1.8 (both log formats)
    "test_training_callbacks.py::test_cli_replay_of_a_demo_run_calls_each_hook_once_per_round",
    "test_log.py::test_truncation_at_every_byte_keeps_every_complete_record",
    # 1.8
    "test_state_files.py::test_fifo_or_dev_zero_in_place_of_a_snapshot_is_refused_without_reading",
    # 1.7: the demo in a subprocess
    "test_demo_costs.py::test_demo_summary_file_adds_the_costs_to_its_keys",
    # 1.1 each
    "test_dispatch_batches.py::test_a_sync_handler_gets_what_its_policy_allows_whatever_it_does",
    "test_dispatch_batches.py::test_an_async_handler_gets_what_its_policy_allows_whatever_it_does",
    "test_resume_arguments.py::"
    "test_a_resume_with_a_changed_argument_warns_on_the_console_and_in_the_event",
    "test_run_console.py::test_a_resume_from_the_run_directory_says_which_checkpoint_it_took",
    # 1.2 and 1.1
    "test_gathering_rounds.py::test_property_the_gatherer_does_what_a_fifo_per_rank_does",
    "test_log_hostile.py::test_the_real_line_limit_holds_memory_to_about_the_limit",
    # 0.9 each
    "test_log_hostile.py::test_a_log_of_gathered_events_reads_without_importing_handlers",
    "test_callback_names.py::test_the_early_stopping_line_of_a_real_run_names_the_callback",
)

#: Tests that legitimately need longer than the default limit (pyproject's ``timeout``), in
#: seconds, with what takes the time.
TIMEOUTS: dict[str, float] = {
    # Hypothesis: 60 examples, each killing and resuming the demo 2 to 4 times: 75 s measured
    # on this machine alone, 390 s while other test runs shared its 2 cores, when each demo
    # was a process started afresh; 53 s shared, each forked from one that imported it.
    "reliability/test_resume_equivalence.py": 1200,
    # With --soak (or RELIABILITY_SOAK=1): 10 million events per backend.
    "reliability/test_soak.py": 1800,
    # One Chromium a page, 22 pages: 48 s measured alone.
    "test_site_browser.py": 600,
}

#: Tests whose own code uses SIGALRM (pytest-timeout's default method): their limit is kept by
#: a thread instead, which on expiry dumps every stack and ends the whole pytest process.
THREAD_TIMEOUT = ("reliability/test_damaged_input.py",)

MARKERS: dict[str, tuple[str, ...]] = {
    "adapters": ADAPTERS,
    "browser": BROWSER,
    "crash": CRASH,
    "slow": SLOW,
}


#: The files whose tests run jobs on a local Ray cluster in this process: they share one
#: (``ray_cluster``, about 8 s to start), run one after another, and on one xdist worker.
RAY_FILES = (
    "adapter_tests/test_ray.py",
    "adapter_tests/test_ray_engine.py",
    "adapter_tests/test_ray_engine_bench.py",
    "adapter_tests/test_ray_examples.py",
    "adapter_tests/test_ray_stalls.py",
)

#: The groups of files (a file, or ``ray`` for RAY_FILES; one xdist worker runs a group) that
#: take longest, longest first, with their seconds in a run of the whole suite on one process
#: (2026-12-07, --durations): the workers take the groups in this order, then the others in
#: the order collected, so that no long group starts last.
LONGEST = (
    "ray",  # 220: ten Ray jobs and more, Ray's examples and its benchmark among them
    "test_docs.py",  # 76
    "reliability/test_resume_equivalence.py",  # 50: 60 demos killed and resumed (forked)
    "test_cli_log.py",  # 46
    "test_examples.py",  # 45
    "test_cli_output_files.py",  # 42
    "adapter_tests/test_lightning_ddp.py",  # 40
    "reliability/test_adversarial.py",  # 35
    "adapter_tests/test_torchrun.py",  # 33: real torchrun jobs, two ranks each
    "adapter_tests/test_trainer_overhead_bench.py",  # 28
    "test_benchmarks_run.py",  # 26
)


def missing_from_the_install() -> list[str]:
    """The packages' modules the editable install cannot import: ``make`` installs it with
    ``editable_mode=strict``, a tree of links made when it was installed, so a module added
    since is importable here (this folder is on the path) but not from another directory, as
    the tests that run commands elsewhere do. Empty for any other kind of install."""
    root = Path(TESTS).parent
    ours = [
        path.relative_to(root).as_posix()
        for package in ("eventbus", "handlers", "adapters")
        for path in sorted((root / package).rglob("*"))
        if path.name == "py.typed" or (path.suffix == ".py" and "__pycache__" not in path.parts)
    ]
    site = Path(sysconfig.get_paths()["purelib"])
    for pth in site.glob("__editable__.train_eventbus-*.pth"):
        for line in pth.read_text().splitlines():
            tree = Path(line.strip())
            if line.strip() and not line.startswith("import") and tree.is_dir():
                return [name for name in ours if not (tree / name).exists()]
    return []


def pytest_configure(config: pytest.Config) -> None:
    missing = missing_from_the_install()
    if missing:
        raise pytest.UsageError(
            f"the editable install lacks {', '.join(missing[:3])}"
            + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
            + " (added since it was made): run `make .venv/.installed-all` to reinstall it"
        )


#: SIGINT's handler when this process began its tests.
_SIGINT_HANDLER = signal.getsignal(signal.SIGINT)


@pytest.fixture(autouse=True)
def sigint_kept() -> Generator[None]:
    """SIGINT's handler as it was when the tests began, before and after each test:
    Lightning ignores SIGINT after an interrupt (its graceful shutdown), in a test or in
    a module's fixture, and a process this worker starts later would inherit that and
    never see a SIGINT."""
    if signal.getsignal(signal.SIGINT) is not _SIGINT_HANDLER:
        signal.signal(signal.SIGINT, _SIGINT_HANDLER)
    yield
    if signal.getsignal(signal.SIGINT) is not _SIGINT_HANDLER:
        signal.signal(signal.SIGINT, _SIGINT_HANDLER)


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def where(item: pytest.Item) -> tuple[str, str]:
    """(path relative to tests/, test name with its parameters) of a collected test."""
    path = os.path.relpath(str(item.path), TESTS).replace(os.sep, "/")
    return path, "::".join(item.nodeid.split("::")[1:])


def matches(keys: Iterable[str], path: str, name: str) -> bool:
    """Whether one of ``keys`` names this folder, file or test (``*`` matches any text)."""
    bare = re.sub(r"\[.*\]$", "", name)
    for key in keys:
        if "*" in key:
            if re.fullmatch(re.escape(key).replace(r"\*", ".*"), f"{path}::{name}"):
                return True
        elif key.endswith("/"):
            if path.startswith(key):
                return True
        elif key in (path, f"{path}::{bare}"):
            return True
    return False


def group(path: str) -> str:
    """The group of a test file, which one xdist worker runs: ``ray`` for RAY_FILES, else
    the file itself."""
    return "ray" if path in RAY_FILES else path


def in_order(items: list[pytest.Item], longest_first: bool) -> list[pytest.Item]:
    """``items`` with RAY_FILES' tests together, where the first of them was (one cluster
    then serves them all); with ``longest_first``, LONGEST's groups first, in its order.
    Each file's tests stay together and in their order."""
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        first.setdefault(group(where(item)[0]), index)

    def key(item: pytest.Item) -> tuple[int, int]:
        name = group(where(item)[0])
        rank = LONGEST.index(name) if longest_first and name in LONGEST else len(LONGEST)
        return rank, first[name]

    return sorted(items, key=key)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``--dist loadfile``, a file's tests to one worker, as pytest-xdist does, but
    RAY_FILES as one file, ``ray``; and the files in the order the workers collected them
    (``in_order``), not xdist's (the files with most tests first). pytest-xdist's own
    groups (``loadgroup``) cannot be used: they rename the tests, which pytest 9.2 ignores."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False

    class ByGroup(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            path = os.path.join(str(config.rootpath), nodeid.split("::", 1)[0])
            return group(os.path.relpath(path, TESTS).replace(os.sep, "/"))

    return ByGroup(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items[:] = in_order(items, longest_first=hasattr(config, "workerinput"))  # an xdist worker
    for item in items:
        path, name = where(item)
        for marker, keys in MARKERS.items():
            if matches(keys, path, name):
                item.add_marker(marker)
        limit = next(
            (seconds for key, seconds in TIMEOUTS.items() if matches((key,), path, name)), None
        )
        thread = matches(THREAD_TIMEOUT, path, name)
        if limit is not None or thread:
            kwargs: dict[str, object] = {"method": "thread"} if thread else {}
            if limit is not None:
                item.add_marker(pytest.mark.timeout(limit, **kwargs))
            else:
                item.add_marker(pytest.mark.timeout(**kwargs))


#: The test that runs after the one being torn down (None after the last), recorded before
#: its fixtures are finalized, so that ``ray_cluster`` knows whether to stay up.
_next_item: list[pytest.Item | None] = [None]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    _next_item[0] = nextitem


@pytest.fixture(scope="module")
def ray_cluster() -> Generator[None]:
    """A local Ray cluster of 2 CPUs, quiet (errors only, the workers' output not
    forwarded), kept up from one file of RAY_FILES to the next and shut down after the
    last, so no other test runs beside it. The test module has set Ray's environment
    (adapter_tests/_ray_env.py) when it imported ray."""
    pytest.importorskip("ray.train", reason="Ray Train is not installed (pip install '.[ray]')")
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield
    upcoming = _next_item[0]
    if upcoming is None or where(upcoming)[0] not in RAY_FILES:
        ray.shutdown()


@pytest.fixture
def joining_ray(ray_cluster: None) -> dict[str, str]:
    """The environment for a process of a test's own to join ``ray_cluster`` (no cluster of
    its own to start), as ``ray job submit`` gives its entrypoint: ``RAY_ADDRESS``."""
    import ray

    return {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """In CI, a browser test that skips fails: CI must not pass without running them."""
    report = yield
    if (
        report.skipped
        and not hasattr(report, "wasxfail")
        and in_ci()
        and item.get_closest_marker("browser") is not None
    ):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"a browser test skipped in CI (CI={os.environ['CI']}): {reason}"
    return report
