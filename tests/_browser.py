"""Render a local HTML page in headless Chromium and report what a user's browser would show.

The HTML report draws its charts on ``<canvas>`` with a vendored JS library; only a real browser
tells whether they drew, whether the page threw, and whether it stayed offline. This drives the
Debian ``chromium`` package over the DevTools protocol on ``--remote-debugging-pipe`` (fds 3 and
4, NUL-terminated JSON), so it needs no third-party package and no port.

Readiness contract: a page sets ``document.body.dataset.ready = "1"`` once its charts drew;
:func:`render_page` waits for that after the load event, or for 2 s if the page never sets it
(``Rendered.ready`` says which).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

__all__ = [
    "Rendered",
    "distinct_colours",
    "find_chromium",
    "nonblank_canvases_js",
    "png_size",
    "render_page",
    "require_chromium",
]

_NAMES = ("chromium", "chromium-browser", "google-chrome")
_READY_WAIT = 2.0
_START_WAIT = 15.0
_POLL = 0.1
_READY_JS = 'document.body !== null && document.body.dataset.ready === "1"'

# Flags: headless without a sandbox (we run as root, often in a container), no GPU, a throwaway
# profile, and none of the background services that would phone home (component updates,
# sync, safe browsing, metrics, field trials, translation...).
_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",  # a container's 64 MB /dev/shm crashes the renderer
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-extensions",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-domain-reliability",
    "--disable-client-side-phishing-detection",
    "--disable-breakpad",
    "--disable-crash-reporter",
    "--metrics-recording-only",
    "--no-pings",
    "--disable-features=Translate,OptimizationHints,MediaRouter,DialMediaRouteProvider,"
    "AutofillServerCommunication,CertificateTransparencyComponentUpdater,InterestFeedContentSuggestions",
    "--password-store=basic",
    "--use-mock-keychain",
    "--mute-audio",
    "--hide-scrollbars",
    "--force-color-profile=srgb",
)


def find_chromium() -> str | None:
    """The Chromium binary on PATH (the first of ``chromium``, ``chromium-browser`` and
    ``google-chrome``), or None. Tests never install it: ``make test`` (and so CI) does."""
    for name in _NAMES:
        found = shutil.which(name)
        if found is not None:
            return found
    return None


def in_ci() -> bool:
    """Whether this is CI (``CI`` set to anything but 0/false, as .ci/run sets it)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require_chromium() -> str:
    """The Chromium binary; else skip the calling test with one line saying how to install it,
    or, in CI (``CI=true``), fail it: CI must not pass without the browser tests."""
    found = find_chromium()
    if found is None:
        message = (
            f"needs Chromium to render pages ({', '.join(_NAMES)}: none on PATH); "
            "install it with `apt-get install chromium` (or `make chromium`, as root)"
        )
        if in_ci():
            pytest.fail(f"{message}; CI runs the browser tests, it does not skip them", False)
        pytest.skip(message)
    return found


@dataclass(frozen=True)
class Rendered:
    """What a page did in the browser.

    ``console_errors``: console.error/console.assert, uncaught exceptions, failed loads and
    the browser's own error log lines. ``network_requests``: every URL requested besides the
    page itself and data:/blob: URLs (a self-contained page requests none). ``value``: the JSON
    value of the ``script`` evaluated after load (None without one). ``ready``: whether the page
    set ``data-ready="1"`` on its body within 2 s of its load event.
    """

    console_errors: list[str]
    network_requests: list[str]
    value: Any
    screenshot: Path
    ready: bool


# For every <canvas>: did it draw at least 2 distinct colours other than its background (its
# most frequent colour; fully transparent pixels never count)? Read through a 2D copy so WebGL
# canvases work too (those need preserveDrawingBuffer). Large canvases are sampled on a grid of
# at most 4M pixels. A canvas that cannot be read (tainted) counts as "unreadable".
nonblank_canvases_js = """(() => {
  const LIMIT = 4000000;
  const canvases = Array.from(document.querySelectorAll("canvas"));
  let drawn = 0, unreadable = 0;
  for (const canvas of canvases) {
    const w = canvas.width, h = canvas.height;
    if (!w || !h) continue;
    let bytes;
    try {
      const copy = document.createElement("canvas");
      copy.width = w;
      copy.height = h;
      const ctx = copy.getContext("2d", {willReadFrequently: true});
      ctx.drawImage(canvas, 0, 0);
      bytes = ctx.getImageData(0, 0, w, h).data;
    } catch (e) {
      unreadable++;
      continue;
    }
    const words = new Uint32Array(bytes.buffer);
    const step = Math.max(1, Math.ceil(Math.sqrt((w * h) / LIMIT)));
    const counts = new Map();
    for (let y = 0; y < h; y += step) {
      for (let x = 0; x < w; x += step) {
        const i = y * w + x;
        const key = bytes[i * 4 + 3] === 0 ? -1 : words[i];
        counts.set(key, (counts.get(key) || 0) + 1);
      }
    }
    let background = -1, most = -1;
    for (const [key, n] of counts) if (n > most) { most = n; background = key; }
    let colours = 0;
    for (const key of counts.keys()) if (key !== -1 && key !== background) colours++;
    if (colours >= 2) drawn++;
  }
  return {canvases: canvases.length, drawn: drawn, unreadable: unreadable};
})()"""


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) of a PNG, from its header (no Pillow needed)."""
    with Path(path).open("rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        raise ValueError(f"{path} is not a PNG")
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def distinct_colours(path: Path, box: tuple[int, int, int, int] | None = None) -> int:
    """How many distinct RGBA colours an image (or its ``box``: left, top, right, bottom) has;
    a blank screenshot has one or two, a drawn chart hundreds."""
    from PIL import Image

    with Image.open(path) as image:
        rgba = image.convert("RGBA")
    if box is not None:
        rgba = rgba.crop(box)
    colours = rgba.getcolors(maxcolors=rgba.width * rgba.height + 1)
    return 0 if colours is None else len(colours)


class _Timeout(RuntimeError):
    pass


class _Chromium:
    """A Chromium process and its DevTools pipe; every read has a deadline."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self._buf = bytearray()
        self._next_id = 0
        self.stderr_path = workdir / "stderr.log"
        profile = workdir / "profile"
        profile.mkdir()
        # Our ends of the pipes, and the child's ends moved above 9 so that the dup2 onto 3
        # and 4 in the child cannot clobber one another.
        to_chrome_r, to_chrome_w = os.pipe()
        from_chrome_r, from_chrome_w = os.pipe()
        child_in = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD_CLOEXEC, 10)
        child_out = fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._wfd, self._rfd = to_chrome_w, from_chrome_r
        log = os.open(self.stderr_path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        log_fd = fcntl.fcntl(log, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(log)
        env = {
            **os.environ,
            # Keep everything Chromium writes inside workdir, which we delete.
            "HOME": str(workdir),
            "XDG_CONFIG_HOME": str(workdir / "config"),
            "XDG_CACHE_HOME": str(workdir / "cache"),
        }
        argv = [binary, *_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-pipe"]
        argv.append("about:blank")
        try:
            # posix_spawn rather than Popen(preexec_fn=...): the fd moves happen in the child
            # without running Python there. A new session lets us kill the renderers too.
            self.pid = os.posix_spawn(
                binary,
                argv,
                env,
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_DUP2, log_fd, 1),
                    (os.POSIX_SPAWN_DUP2, log_fd, 2),
                    (os.POSIX_SPAWN_DUP2, child_in, 3),
                    (os.POSIX_SPAWN_DUP2, child_out, 4),
                ],
                setsid=True,
                # Python ignores SIGPIPE; Chromium expects the default.
                setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
            )
        except BaseException:
            os.close(self._wfd)
            os.close(self._rfd)
            raise
        finally:
            for fd in (child_in, child_out, log_fd):
                os.close(fd)
        os.set_blocking(self._wfd, False)

    def stderr_tail(self, limit: int = 3000) -> str:
        try:
            data = self.stderr_path.read_bytes()
        except OSError:
            return "(no stderr)"
        text = data[-limit:].decode("utf-8", "replace").strip()
        return text or "(empty)"

    def exited(self) -> bool:
        """Whether the browser process ended (without reaping it, so its pid stays ours)."""
        try:
            return os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:  # something else reaped it (a waitpid(-1) child watcher)
            return True

    def send(
        self, method: str, params: dict[str, Any], session: str | None, deadline: float
    ) -> int:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        data = memoryview(json.dumps(message).encode() + b"\0")
        while data:
            _, ready, _ = select.select([], [self._wfd], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise _Timeout(f"sending {method}")
            try:
                data = data[os.write(self._wfd, data) :]
            except BrokenPipeError:
                raise RuntimeError(
                    f"chromium closed its DevTools pipe (sending {method})"
                ) from None
        return self._next_id

    def read(self, deadline: float) -> dict[str, Any] | None:
        """The next message, or None once ``deadline`` passed without one."""
        while True:
            end = self._buf.find(b"\0")
            if end >= 0:
                raw = bytes(self._buf[:end])
                del self._buf[: end + 1]
                message: dict[str, Any] = json.loads(raw)
                return message
            left = max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self._rfd], [], [], min(left, 0.5))
            if not ready:
                if left <= 0:
                    return None
                continue
            chunk = os.read(self._rfd, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed its DevTools pipe (did it crash?)")
            self._buf += chunk

    def close(self) -> None:
        """Ask the browser to quit, then kill whatever is left of it and reap it."""
        try:
            if not self.exited():
                with contextlib.suppress(Exception):
                    self.send("Browser.close", {}, None, time.monotonic() + 1)
                _wait_until(self.exited, 5)
        finally:
            with contextlib.suppress(Exception):
                os.killpg(self.pid, signal.SIGKILL)  # helpers too (same session)
            _wait_until(self.exited, 5)
            with contextlib.suppress(Exception):
                os.waitpid(self.pid, os.WNOHANG)
            for fd in (self._wfd, self._rfd):
                with contextlib.suppress(Exception):
                    os.close(fd)


def _wait_until(done: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


class _Page:
    """One page target on a flattened session: commands, and the events we collect."""

    def __init__(self, browser: _Chromium, url: str, deadline: float) -> None:
        self.browser = browser
        self.url = url
        self.deadline = deadline
        self.session: str | None = None
        self.errors: list[str] = []
        self.requests: list[str] = []
        self._request_urls: dict[str, str] = {}
        self.loaded = False
        self.crashed = False

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send a command and return its result, collecting the events that arrive meanwhile."""
        sent = self.browser.send(method, params or {}, self.session, self.deadline)
        while True:
            message = self._next(f"the answer to {method}")
            if message.get("id") == sent:
                if "error" in message:
                    raise RuntimeError(f"chromium: {method} failed: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result

    def pump(self, until: Callable[[], bool], what: str, *, deadline: float | None = None) -> bool:
        """Collect events until ``until()``; False at ``deadline``, raising at the render's."""
        stop = self.deadline if deadline is None else min(deadline, self.deadline)
        while not until():
            if time.monotonic() >= stop:
                if stop >= self.deadline:
                    raise _Timeout(what)
                return False
            message = self.browser.read(stop)
            if message is not None:
                self._handle(message)
        return True

    def drain(self) -> None:
        """Collect the events already sent (e.g. a failed load reported after the load event)."""
        while (message := self.browser.read(time.monotonic())) is not None:
            self._handle(message)

    def _next(self, what: str) -> dict[str, Any]:
        message = self.browser.read(self.deadline)
        if message is None:
            raise _Timeout(what)
        self._handle(message)
        return message

    def _handle(self, message: dict[str, Any]) -> None:
        method = message.get("method")
        if method is None or message.get("sessionId") != self.session:
            return
        params: dict[str, Any] = message.get("params", {})
        if method == "Page.loadEventFired":
            self.loaded = True
        elif method == "Inspector.targetCrashed":
            self.crashed = True
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            text = " ".join(_remote_text(arg) for arg in params.get("args", []))
            frames = params.get("stackTrace", {}).get("callFrames", [])
            where = _where(frames[0]) if frames else ""
            self.errors.append(f"console.{params['type']}: {text}{where}")
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            exc = details.get("exception", {})
            text = (exc.get("description") or _remote_text(exc)) if exc else ""
            head = details.get("text", "Uncaught")
            where = _where(details)
            if where.strip(" ()") in text:  # the stack already says where
                where = ""
            self.errors.append(f"{head} {text}{where}".strip())
        elif method == "Log.entryAdded":
            entry = params.get("entry", {})
            if entry.get("level") == "error":
                url = entry.get("url")
                where = f" ({url})" if url else ""
                self.errors.append(f"log.{entry.get('source')}: {entry.get('text')}{where}")
        elif method == "Network.requestWillBeSent":
            url = params.get("request", {}).get("url", "")
            self._request_urls[params.get("requestId", "")] = url
            page = self.url.split("#", 1)[0]
            own = url.split("#", 1)[0] == page or url.startswith(("data:", "blob:"))
            if not own and url not in self.requests:
                self.requests.append(url)
        elif method == "Network.loadingFailed":
            url = self._request_urls.get(params.get("requestId", ""), "(unknown URL)")
            why = params.get("errorText", "")
            if params.get("blockedReason"):
                why += f", blocked: {params['blockedReason']}"
            if params.get("canceled"):
                why += ", canceled"
            self.errors.append(f"network: {url} failed: {why}")


def _remote_text(obj: dict[str, Any]) -> str:
    """A Runtime.RemoteObject as console would print it."""
    if "value" in obj:
        value = obj["value"]
        return value if isinstance(value, str) else json.dumps(value)
    return str(obj.get("unserializableValue") or obj.get("description") or obj.get("type"))


def _where(frame: dict[str, Any]) -> str:
    url = frame.get("url")
    if not url:
        return ""
    return f" ({url}:{int(frame.get('lineNumber', 0)) + 1}:{int(frame.get('columnNumber', 0)) + 1})"


def render_page(
    html: Path,
    screenshot: Path,
    *,
    width: int = 1280,
    height: int = 2000,
    script: str | None = None,
    timeout: float = 60,
    ready_wait: float = _READY_WAIT,
) -> Rendered:
    """Load ``html`` (a local file) in headless Chromium at ``width``x``height``, evaluate
    ``script`` once it is ready and write a PNG screenshot of the viewport to ``screenshot``.
    A page that never says it is ready (``data-ready``: the docs site's) is waited for
    ``ready_wait`` seconds after its load event.

    Raises RuntimeError (with the tail of Chromium's stderr) when something takes longer than
    ``timeout`` seconds in all, or the browser crashes; the browser is gone when this returns.
    """
    html = Path(html).resolve()
    if not html.is_file():
        raise FileNotFoundError(html)
    binary = require_chromium()
    deadline = time.monotonic() + timeout
    with tempfile.TemporaryDirectory(prefix="eventbus-chromium-") as tmp:
        browser, page = _open_page(binary, Path(tmp), html.as_uri(), deadline)
        step = "Emulation.setDeviceMetricsOverride"
        try:
            page.call(
                "Emulation.setDeviceMetricsOverride",
                {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            )
            step = f"Page.navigate to {page.url}"
            page.loaded = False
            navigated = page.call("Page.navigate", {"url": page.url})
            if navigated.get("errorText"):
                raise RuntimeError(f"chromium could not open {page.url}: {navigated['errorText']}")
            step = "the page's load event (Page.loadEventFired)"
            page.pump(lambda: page.loaded or page.crashed, step)
            step = 'document.body.dataset.ready === "1"'
            ready = False
            ready_by = time.monotonic() + ready_wait
            while not page.crashed:
                ready = _evaluate(page, _READY_JS) is True
                if ready or time.monotonic() >= ready_by:
                    break
                page.pump(lambda: page.crashed, step, deadline=time.monotonic() + _POLL)
            value = None
            if script is not None and not page.crashed:
                step = "the script's result (Runtime.evaluate)"
                value = _evaluate(page, script)
            if page.crashed:
                raise RuntimeError(f"chromium's renderer crashed ({page.url})")
            step = "the screenshot (Page.captureScreenshot)"
            shot = page.call(
                "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}
            )
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            screenshot.write_bytes(base64.b64decode(shot["data"]))
            page.drain()
        except _Timeout as exc:
            raise RuntimeError(
                f"chromium timed out after {timeout:g}s waiting for {exc}; "
                f"its stderr ends with:\n{browser.stderr_tail()}"
            ) from None
        except RuntimeError as exc:
            raise RuntimeError(
                f"{exc} (while waiting for {step}); "
                f"chromium's stderr ends with:\n{browser.stderr_tail()}"
            ) from None
        finally:
            browser.close()
    return Rendered(
        console_errors=page.errors,
        network_requests=page.requests,
        value=value,
        screenshot=screenshot,
        ready=ready,
    )


def _open_page(binary: str, workdir: Path, url: str, deadline: float) -> tuple[_Chromium, _Page]:
    """A browser with one page attached and its domains enabled.

    Chromium sometimes never answers its first commands: CI saw 30 s of silence after
    Target.attachToTarget from a browser that had started. A fresh browser then answers, so a
    start that stalls for _START_WAIT seconds is retried once, within the render's deadline.
    """
    started = time.monotonic()
    for attempt in (1, 2):
        attempt_dir = workdir / f"browser-{attempt}"
        attempt_dir.mkdir()
        browser = _Chromium(binary, attempt_dir)
        start_by = deadline if attempt == 2 else min(deadline, time.monotonic() + _START_WAIT)
        page = _Page(browser, url, start_by)
        step = "a page target (Target.createTarget)"
        try:
            target = page.call("Target.createTarget", {"url": "about:blank"})["targetId"]
            step = "attaching to the page (Target.attachToTarget)"
            attached = page.call("Target.attachToTarget", {"targetId": target, "flatten": True})
            page.session = attached["sessionId"]
            for domain in ("Page", "Runtime", "Log", "Network", "Inspector"):
                step = f"{domain}.enable"
                page.call(f"{domain}.enable")
        except _Timeout as exc:
            stderr = browser.stderr_tail()
            browser.close()
            if attempt == 2 or time.monotonic() >= deadline:
                tries = " (the second browser too)" if attempt == 2 else ""
                raise RuntimeError(
                    f"chromium timed out after {time.monotonic() - started:.3g}s waiting for "
                    f"{exc}{tries}; its stderr ends with:\n{stderr}"
                ) from None
            continue
        except RuntimeError as exc:
            stderr = browser.stderr_tail()
            browser.close()
            raise RuntimeError(
                f"{exc} (while waiting for {step}); chromium's stderr ends with:\n{stderr}"
            ) from None
        except BaseException:
            browser.close()
            raise
        page.deadline = deadline
        return browser, page
    raise AssertionError("the loop returns or raises")


def _evaluate(page: _Page, expression: str) -> Any:
    """The JSON value of ``expression`` in the page (awaiting a promise); raises if it threw."""
    result = page.call(
        "Runtime.evaluate",
        {"expression": expression, "returnByValue": True, "awaitPromise": True},
    )
    if "exceptionDetails" in result:
        details = result["exceptionDetails"]
        exc = details.get("exception", {})
        raise RuntimeError(
            f"evaluating {expression[:80]!r} threw: {exc.get('description') or details.get('text')}"
        )
    return result.get("result", {}).get("value")
