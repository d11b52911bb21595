"""The peer tables of `python -m scripts.bench peers`: our sidecar against llama.cpp's server.

Every table is one interleaved run (sidecar, llama.cpp, sidecar, ...), both engines on the same
model (the GGUF is a conversion of the ONNX model, scripts/bench/peers/gguf_model.py), the same
prompt tokens, greedy, the same number of generated tokens, the same thread count:

    prefill   prefill and decode tok/s at 16/128/512/1024 prompt tokens (the decision record's
              lengths); each repetition's prompt differs from the last one's from its first
              word on, and llama.cpp's cache_prompt is off, so neither engine reuses a prefix
    turns     time to first token of turns 1-5 of one growing conversation (user turns of
              about `turn_tokens` tokens, fixed assistant replies), each server's prompt cache
              as it ships (llama.cpp: cache_prompt on); `cached` says how many prompt tokens a
              server reports it reused
    users     1/2/4 users at once (aggregate tok/s, worst time to first token); llama.cpp runs
              as many slots as the most users, our sidecar its configured MAX_CONCURRENCY
    memory    peak RSS (VmHWM) of each server process tree, against its model files
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from scripts.bench.drivers import (
    RawEngine,
    Sample,
    released_at_once,
    sized_messages,
    via_sidecar,
    words,
)
from scripts.bench.peers import llamacpp

PREFILL_LENGTHS = (16, 128, 512, 1024)
TURNS = 5
USERS = (1, 2, 4)
REPLY = "Here is what I found about that, in a few short words for the page."


def conversation(engine: RawEngine, turn_tokens: int, shift: int) -> list[list[dict[str, str]]]:
    """The requests of turns 1..TURNS of one conversation: turn t sends the first t user turns
    (each about `turn_tokens` tokens of text) with fixed assistant replies between them."""
    turns: list[list[dict[str, str]]] = []
    history: list[dict[str, str]] = []
    for t in range(TURNS):
        count = 1
        while len(engine.tokenizer.encode(words(count, shift + t))) < turn_tokens:
            count += 1
        history = [*history, {"role": "user", "content": words(count, shift + t)}]
        turns.append(history)
        history = [*history, {"role": "assistant", "content": REPLY}]
    return turns


def sidecar_run(
    client: httpx.Client, url: str, messages: list[dict[str, str]], new_tokens: int, rep: int
) -> tuple[Sample, int | None]:
    """POST /predict (bench_variants.via_sidecar), and the cached prompt tokens it reports."""
    sample = via_sidecar(client, url, messages, new_tokens, rep)
    return sample, sample.cached_tokens


@dataclass
class Peers:
    """What the peer tables need: our engine's tokenizer (for prompt ids), both servers."""

    engine: RawEngine
    sidecar_url: str
    llama_url: str
    new_tokens: int
    reps: int
    pause: float
    log: Callable[[str], None] = print
    client: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=900))

    def ids(self, messages: list[dict[str, str]]) -> list[int]:
        return [int(i) for i in self.engine.prompt_ids(messages)]

    def sidecar(self, messages: list[dict[str, str]], rep: int) -> tuple[Sample, int | None]:
        return sidecar_run(self.client, self.sidecar_url, messages, self.new_tokens, rep)

    def llama(
        self, messages: list[dict[str, str]], rep: int, cache: bool = False
    ) -> tuple[Sample, int]:
        sample, timings = llamacpp.complete(
            self.client,
            self.llama_url,
            self.ids(messages),
            self.new_tokens,
            rep,
            cache_prompt=cache,
        )
        return sample, int(timings.get("cache_n", 0))

    def prefill(self, lengths: Sequence[int] = PREFILL_LENGTHS) -> list[dict[str, Any]]:
        rows = []
        for length in lengths:
            samples: dict[str, list[Sample]] = {"sidecar": [], "llamacpp": []}
            tokens: list[int] = []
            for rep in range(self.reps):
                messages = sized_messages(self.engine, length, shift=100 + rep)
                tokens.append(len(self.ids(messages)))
                ours, _ = self.sidecar(messages, rep)
                time.sleep(self.pause)
                theirs, _ = self.llama(messages, rep)
                time.sleep(self.pause)
                samples["sidecar"].append(ours)
                samples["llamacpp"].append(theirs)
                self.log(
                    f"  prefill {tokens[-1]:5d} tokens rep {rep}: ttft sidecar "
                    f"{ours.ttft_s:6.2f} s, llamacpp {theirs.ttft_s:6.2f} s"
                )
            n = statistics.median(tokens)
            row: dict[str, Any] = {"target": length, "prompt_tokens": n}
            for name, mine in samples.items():
                row[name] = {
                    "prefill_tps": statistics.median(
                        t / s.ttft_s for t, s in zip(tokens, mine, strict=True)
                    ),
                    "decode_tps": statistics.median(s.decode_tps for s in mine),
                    "ttft_s": statistics.median(s.ttft_s for s in mine),
                    "samples": [s.as_dict() for s in mine],
                }
            rows.append(row)
        return rows

    def turns(self, turn_tokens: int) -> list[dict[str, Any]]:
        per_turn: list[dict[str, Any]] = [
            {"turn": t + 1, "prompt_tokens": [], "sidecar": [], "llamacpp": []}
            for t in range(TURNS)
        ]
        for rep in range(self.reps):
            # A new conversation each repetition (its own first words): no cache carries over.
            requests = conversation(self.engine, turn_tokens, shift=200 + 10 * rep)
            for t, messages in enumerate(requests):
                ours, our_cache = self.sidecar(messages, rep)
                time.sleep(self.pause)
                theirs, their_cache = self.llama(messages, rep, cache=True)
                time.sleep(self.pause)
                row = per_turn[t]
                row["prompt_tokens"].append(len(self.ids(messages)))
                row["sidecar"].append({"ttft_s": ours.ttft_s, "cached": our_cache})
                row["llamacpp"].append({"ttft_s": theirs.ttft_s, "cached": their_cache})
                self.log(
                    f"  turn {t + 1} ({row['prompt_tokens'][-1]} tokens) rep {rep}: ttft sidecar "
                    f"{ours.ttft_s:6.2f} s, llamacpp {theirs.ttft_s:6.2f} s "
                    f"({their_cache} cached)"
                )
        return per_turn

    def users(self, counts: Sequence[int], prompt_tokens: int) -> list[dict[str, Any]]:
        """N users at once, each with a prompt of its own of `prompt_tokens` tokens."""
        rows = []
        for n in counts:
            chats = [sized_messages(self.engine, prompt_tokens, 300 + i) for i in range(n)]
            row: dict[str, Any] = {"n": n, "prompt_tokens": len(self.ids(chats[-1]))}
            for name in ("sidecar", "llamacpp"):
                row[name] = self._burst(name, chats)
                time.sleep(self.pause)
            self.log(
                f"  {n} users: aggregate sidecar {row['sidecar']['aggregate_tps']:.2f}, "
                f"llamacpp {row['llamacpp']['aggregate_tps']:.2f} tok/s"
            )
            rows.append(row)
        return rows

    def _burst(self, name: str, chats: list[list[dict[str, str]]]) -> dict[str, Any]:
        """One request per chat, released at once, each on its own connection."""
        ids = [self.ids(chat) for chat in chats]

        def one(client: httpx.Client, i: int) -> Sample:
            if name == "sidecar":
                return sidecar_run(client, self.sidecar_url, chats[i], self.new_tokens, i)[0]
            return llamacpp.complete(client, self.llama_url, ids[i], self.new_tokens, i)[0]

        samples, wall = released_at_once(len(chats), one, timeout=900)
        ok = [s for s in samples if s.status == 200]
        return {
            "accepted": len(ok),
            "aggregate_tps": sum(s.tokens for s in ok) / wall if ok else 0.0,
            "ttft_worst_s": max((s.ttft_s for s in ok), default=None),
            "wall_s": wall,
            "samples": [s.as_dict() for s in samples],
        }


def context_size(
    engine: RawEngine,
    *,
    lengths: Sequence[int],
    turn_tokens: int,
    users: Sequence[int],
    users_tokens: int,
    new_tokens: int,
    reps: int,
) -> int:
    """llama-server's shared KV cache (-c): room for the longest request of the tables, or for
    every user's request at once, whichever is more; a multiple of 256."""

    def size(messages: list[dict[str, str]]) -> int:
        return len(engine.prompt_ids(messages)) + new_tokens

    longest = max(size(sized_messages(engine, n, 100 + r)) for n in lengths for r in range(reps))
    turns = max(size(conversation(engine, turn_tokens, 200 + 10 * r)[-1]) for r in range(reps))
    together = sum(size(sized_messages(engine, users_tokens, 300 + i)) for i in range(max(users)))
    need = max(longest, turns, together)
    return -(-need // 256) * 256


def ratio(theirs: float | None, ours: float | None) -> str:
    return "-" if not theirs or not ours else f"{theirs / ours:.2f}"


def markdown(peers: dict[str, Any]) -> str:
    """The peer tables; every ratio is llama.cpp's figure over our sidecar's."""
    lines = [
        f"Peer: {peers['llamacpp_version']}, `{Path(peers['gguf']).name}` "
        f"({peers['gguf_bytes']:,} bytes; the ONNX model's files: {peers['onnx_bytes']:,}); "
        f"{peers['threads']} threads for decode and prompt, {peers['slots']} slots, "
        f"{peers['context']} tokens of KV cache; load average {peers['load_average'][0]:.1f} "
        f"before, {peers['load_average'][1]:.1f} after. Ratios: llama.cpp / sidecar.",
        "",
        "| prompt tokens | sidecar prefill tok/s | llama.cpp | ratio "
        "| sidecar decode tok/s | llama.cpp | ratio |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in peers["prefill"]:
        ours, theirs = row["sidecar"], row["llamacpp"]
        lines.append(
            f"| {row['prompt_tokens']:.0f} | {ours['prefill_tps']:.1f} "
            f"| {theirs['prefill_tps']:.1f} | {ratio(theirs['prefill_tps'], ours['prefill_tps'])} "
            f"| {ours['decode_tps']:.2f} | {theirs['decode_tps']:.2f} "
            f"| {ratio(theirs['decode_tps'], ours['decode_tps'])} |"
        )
    lines += [
        "",
        "| turn | prompt tokens | sidecar TTFT (s) | cached | llama.cpp TTFT (s) | cached "
        "| ratio |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in peers["turns"]:

        def med(name: str, key: str, row: dict[str, Any] = row) -> float | None:
            values = [r[key] for r in row[name] if r[key] is not None]
            return statistics.median(values) if values else None

        ours, theirs = med("sidecar", "ttft_s"), med("llamacpp", "ttft_s")
        our_cache, their_cache = med("sidecar", "cached"), med("llamacpp", "cached")
        lines.append(
            f"| {row['turn']} | {statistics.median(row['prompt_tokens']):.0f} "
            f"| {ours:.2f} | {'-' if our_cache is None else f'{our_cache:.0f}'} "
            f"| {theirs:.2f} | {'-' if their_cache is None else f'{their_cache:.0f}'} "
            f"| {ratio(theirs, ours)} |"
        )
    lines += [
        "",
        "| users | sidecar aggregate tok/s | llama.cpp | ratio "
        "| sidecar worst TTFT (s) | llama.cpp | ratio |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in peers["users"]:
        ours, theirs = row["sidecar"], row["llamacpp"]
        worst_ours, worst_theirs = ours["ttft_worst_s"], theirs["ttft_worst_s"]
        lines.append(
            f"| {row['n']} | {ours['aggregate_tps']:.2f} | {theirs['aggregate_tps']:.2f} "
            f"| {ratio(theirs['aggregate_tps'], ours['aggregate_tps'])} "
            f"| {worst_ours or 0:.2f} | {worst_theirs or 0:.2f} "
            f"| {ratio(worst_theirs, worst_ours)} |"
        )
    lines += [
        "",
        "| server | peak RSS (MiB) | of it mapped from files, at the end (MiB) "
        "| model files (MiB) | peak / model files |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, mem in peers["memory"].items():
        peak, files, mapped = mem["peak_bytes"], mem["model_bytes"], mem["file_backed_bytes"]
        lines.append(
            f"| {name} | {peak / 2**20:.0f} | {mapped / 2**20:.0f} | {files / 2**20:.0f} "
            f"| {peak / files:.2f} |"
        )
    return "\n".join(lines)


def file_backed_bytes(pid: int) -> int:
    """RssFile of a process and its children: resident pages mapped from files (llama.cpp maps
    its GGUF and keeps the mapping after copying weights into repacked buffers)."""
    import psutil

    root = psutil.Process(pid)
    total = 0
    for proc in [root, *root.children(recursive=True)]:
        status = Path(f"/proc/{proc.pid}/status").read_text()
        kib = next(line.split()[1] for line in status.splitlines() if line.startswith("RssFile"))
        total += int(kib) * 1024
    return total


def plot(peers: dict[str, Any], axes: Any) -> None:
    """Two panels: prefill tok/s by prompt length, and aggregate tok/s by users, both engines."""
    lengths = [row["prompt_tokens"] for row in peers["prefill"]]
    for name, style in (("sidecar", "o-"), ("llamacpp", "s--")):
        label = "llama.cpp" if name == "llamacpp" else name
        axes[0].plot(
            lengths, [row[name]["prefill_tps"] for row in peers["prefill"]], style, label=label
        )
        users = [row["n"] for row in peers["users"]]
        axes[1].plot(
            users, [row[name]["aggregate_tps"] for row in peers["users"]], style, label=label
        )
    axes[0].set_xscale("log", base=2)
    axes[0].set_xticks(lengths, [f"{n:.0f}" for n in lengths])
    axes[0].set_title("prefill tok/s by prompt length")
    axes[0].set_xlabel("prompt tokens")
    axes[1].set_xticks([row["n"] for row in peers["users"]])
    axes[1].set_title("aggregate tok/s by simultaneous users")
    axes[1].set_xlabel("users")
    for ax in axes:
        ax.legend()
