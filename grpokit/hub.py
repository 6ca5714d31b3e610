"""Is the Hugging Face hub reachable? Asked once, answered in at most `timeout` seconds.

Without this check an offline machine (or one behind a proxy it was not told about) spends minutes in
huggingface_hub's retries before failing with a stack of connection errors. `require_hub("Qwen/Qwen2.5-7B")` turns
that into one line, up front, before any model or data is loaded:

    from grpokit.hub import require_hub
    require_hub(f"model '{hub_id}'")      # raises config.errors.UsageError when the hub cannot be reached

Only the standard library is used, so the check costs nothing at import time.
"""

from __future__ import annotations

import os
import socket
import threading
import urllib.parse
import urllib.request

from config.errors import UsageError

DEFAULT_ENDPOINT = "https://huggingface.co"
_TRUTHY = {"1", "on", "yes", "true"}

# (endpoint, proxy) -> answer. A run asks several times (model, tokenizer, dataset); the network does not change
# between those questions, and a second 2 s wait would only repeat the first.
_cache: dict[tuple[str, str], bool] = {}


def hub_endpoint() -> str:
    """The hub huggingface_hub would talk to: HF_ENDPOINT (a mirror) or huggingface.co."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def offline_variable() -> str | None:
    """The variable that tells huggingface_hub / transformers not to use the network, if one is set."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(name, "").strip().lower() in _TRUTHY:
            return name
    return None


def hub_offline() -> bool:
    """True when the user told huggingface_hub not to use the network (it then never tries, so neither do we)."""
    return offline_variable() is not None


def _target(endpoint: str) -> tuple[str, int, str]:
    """(host, port, proxy) to connect to: the proxy when one is configured for this host, else the hub itself."""
    url = urllib.parse.urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
    scheme = url.scheme or "https"
    host, port = url.hostname or "", url.port or (443 if scheme == "https" else 80)
    proxy = urllib.request.getproxies().get(scheme, "")
    if proxy and not urllib.request.proxy_bypass(host):
        # Behind a proxy the hub is reached through it: a direct connect would fail where downloads work.
        proxy_url = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        return proxy_url.hostname or "", proxy_url.port or 8080, proxy
    return host, port, ""


def _connects(host: str, port: int, timeout: float) -> bool:
    """A TCP connection within `timeout` seconds, DNS lookup included.

    socket.create_connection's timeout does not cover getaddrinfo, which can itself hang for the resolver's own
    timeout (5 s x attempts) on a machine without DNS; so the whole attempt runs in a daemon thread and we wait for
    it at most `timeout` seconds."""
    answer: list[bool] = []

    def attempt() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                answer.append(True)
        except OSError:
            answer.append(False)

    worker = threading.Thread(target=attempt, name="hub-reachable", daemon=True)
    worker.start()
    worker.join(timeout)
    return bool(answer and answer[0])


def hub_reachable(timeout: float = 2.0) -> bool:
    """Whether the hub (HF_ENDPOINT or huggingface.co; through the configured proxy if any) accepts a TCP
    connection within `timeout` seconds. False at once when HF_HUB_OFFLINE=1. Cached per process."""
    if hub_offline():
        return False
    endpoint = hub_endpoint()
    host, port, proxy = _target(endpoint)
    key = (endpoint, proxy)
    if key not in _cache:
        _cache[key] = bool(host) and _connects(host, port, timeout)
    return _cache[key]


def require_hub(what: str, timeout: float = 2.0) -> None:
    """Raise a one-line UsageError when `what` (e.g. "model 'Qwen/Qwen2.5-7B'", "dataset 'openai/gsm8k'") would
    need the unreachable hub; the fix offered is the one for a model or for a dataset."""
    fix = ("a local copy with --dataset-path (a directory or data files), or your own --custom-data JSONL"
           if what.startswith("dataset") else
           "a local model directory (--model DIR, as save_pretrained writes it), or the embedded 'smollm2-135m'")
    variable = offline_variable()
    if variable:
        raise UsageError(
            f"{variable} is set, so {what} cannot be downloaded from the Hugging Face hub: unset it, or use {fix}.")
    if hub_reachable(timeout):
        return
    endpoint = hub_endpoint()
    host, _, proxy = _target(endpoint)
    via = f" via proxy {proxy}" if proxy else ""
    raise UsageError(
        f"Cannot reach the Hugging Face hub ({urllib.parse.urlsplit(endpoint).hostname or host}{via}, {timeout:g} s) "
        f"to download {what}: you are offline or behind a proxy. Use {fix}.")


def use_local_cache_only() -> None:
    """The hub is out of reach: make huggingface_hub, transformers and datasets read their local caches instead of
    retrying the network (the same switch as HF_HUB_OFFLINE=1, set on the already-imported modules too; the
    environment variable itself is left alone so `require_hub` can still tell the user's setting from ours)."""
    import sys

    constants = sys.modules.get("huggingface_hub.constants")
    if constants is None:
        import huggingface_hub.constants as constants
    constants.HF_HUB_OFFLINE = True
    datasets_config = sys.modules.get("datasets.config")
    if datasets_config is not None:
        datasets_config.HF_HUB_OFFLINE = True
        if hasattr(datasets_config, "HF_DATASETS_OFFLINE"):
            datasets_config.HF_DATASETS_OFFLINE = True


def clear_cache() -> None:
    """Forget earlier answers (tests; a long-lived process whose network changed)."""
    _cache.clear()
