"""ExitTrain's data for each shipped pair.

The default pair fine-tunes on chat conversations its target wrote itself: ``python -m tev
exittrain-data`` takes them from a finished ``train-drafter`` work folder (the same train /
held-out split as the base drafter's, so held-out conversations stay unseen) and writes
``assets/models/smollm2/exittrain-data.safetensors``: up to ``--per-domain`` training
conversations of each domain and every held-out one, each cut to its prompt and at most
``--response-tokens`` of its answer (int32 ids, a few hundred KB). The tiny pair keeps its
target-regenerated corpus sequences (``build-assets``).
"""

from __future__ import annotations

from pathlib import Path

from tev.engine.models import DEFAULT_PAIR
from tev.pipelines.train_drafter import cached_conversations, split_conversations
from tev.train.data import DOMAINS, TrainData, load_train_data, save_train_data

__all__ = ["conversation_data", "build_chat_exittrain_data", "load_chat_exittrain_data", "exittrain_data_command"]

PAD_ID = 0  # padding is never attended to by a tree nor labelled, so any id will do


def _first_per_domain(data: TrainData, per_domain: int) -> TrainData:
    """The first ``per_domain`` rows of each domain, in their order."""
    taken = {domain: 0 for domain in DOMAINS}
    keep = []
    for i, domain in enumerate(data.domains):
        if taken.get(domain, per_domain) < per_domain:
            taken[domain] += 1
            keep.append(i)
    return data.select(keep)


def conversation_data(conversations, max_response_tokens: int, min_anchors: int = 8) -> TrainData:
    """Chat conversations (:func:`tev.train.teacher.write_responses`) as training data: each
    cut to its prompt and at most ``max_response_tokens`` of its response; a conversation with
    fewer than ``min_anchors`` anchors is left out."""
    sequences, starts = conversations.sequences, conversations.prompt_lengths.tolist()
    kept = [i for i, (ids, start) in enumerate(zip(sequences, starts)) if min(len(ids), start + max_response_tokens) - start >= min_anchors]
    if not kept:
        raise ValueError(f"no conversation has a response of {min_anchors} tokens or more")
    rows = [sequences[i][: starts[i] + max_response_tokens] for i in kept]
    return TrainData.from_lists(rows, [starts[i] for i in kept], PAD_ID, [conversations.domains[i] for i in kept])


def build_chat_exittrain_data(work: Path, per_domain: int, response_tokens: int, min_anchors: int = 16) -> dict[str, TrainData]:
    """``train`` (up to ``per_domain`` conversations of each domain, in the split's seeded
    order) and ``heldout`` (every held-out conversation) from a ``train-drafter`` work folder."""
    conversations, recipe = cached_conversations(Path(work))
    train, heldout = split_conversations(conversations, recipe)
    return {
        "train": _first_per_domain(conversation_data(train, response_tokens, min_anchors), per_domain),
        "heldout": conversation_data(heldout, response_tokens, min_anchors),
    }


def load_chat_exittrain_data(domain: str | None = None, path: Path | None = None) -> tuple[TrainData, TrainData]:
    """(train, held-out) of the default pair's shipped ExitTrain data, of one domain when given."""
    path = Path(path or DEFAULT_PAIR.exittrain_data_path())
    if not path.is_file():
        raise FileNotFoundError(f"the default pair's ExitTrain data is missing ({path}); rebuild it with "
                                "`python -m tev exittrain-data --work-dir runs/train-drafter-smollm2` after `python -m tev train-drafter`")
    parts = load_train_data(path)
    if domain:
        return parts["train"].domain(domain), parts["heldout"].domain(domain)
    return parts["train"], parts["heldout"]


def exittrain_data_command(args) -> None:
    if args.per_domain < 1 or args.response_tokens < 16:
        raise ValueError("--per-domain must be at least 1 and --response-tokens at least 16")
    parts = build_chat_exittrain_data(Path(args.work_dir), args.per_domain, args.response_tokens)
    out = Path(args.out) if args.out else DEFAULT_PAIR.exittrain_data_path()
    save_train_data(out, parts)
    for name, part in parts.items():
        counts = {d: part.domains.count(d) for d in DOMAINS}
        print(f"{name}: {len(part)} conversations {counts}, {int(part.spans.sum())} anchors, width {part.token_ids.shape[1]}")
    print(f"wrote {out} ({out.stat().st_size / 1e3:.0f} kB)")
