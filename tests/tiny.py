"""Tiny random models for tests, built in temporary folders (no download)."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from tev.engine.block_drafter import BlockDrafter, BlockDrafterConfig

from tev.engine.drafters import ARTreeDrafter, BlockTreeDrafter, DraftContext, DraftState
from tev.engine.models import drafter_model_class, tree_drafter_of
from tev.engine.path_drafter import PathTreeDrafter
from tev.core.tree import DraftTree

CORPUS = ["def add(a, b):\n    return a + b\n", "for i in range(10):\n    print(i)\n", "class A:\n    pass\n"] * 20


def tiny_tokenizer(vocab_size: int = 300, corpus=CORPUS, seed_text: str = "") -> PreTrainedTokenizerFast:
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    bpe.train_from_iterator([seed_text + text for text in corpus], trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<|endoftext|>", eos_token="<|endoftext|>", clean_up_tokenization_spaces=False)


def tiny_target(vocab_size: int, arch: str = "llama", context: int = 96, seed: int = 0, eos_token_id: int = 0, scale: float = 1.0):
    """A random causal LM; ``scale`` multiplies the output head (peakier rows when > 1)."""
    torch.manual_seed(seed)
    common = dict(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=context, eos_token_id=eos_token_id, bos_token_id=eos_token_id, tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(LlamaConfig(**common)) if arch == "llama" else Qwen3ForCausalLM(Qwen3Config(head_dim=8, **common))
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model.eval()


def tiny_block_drafter(target, horizon: int = 4, seed: int = 1, conditioning: str = "marginal") -> BlockTreeDrafter | PathTreeDrafter:
    """A random block drafter of ``target`` (``conditioning="path"``: a path drafter, growing its tree depth by depth)."""
    torch.manual_seed(seed)
    config = BlockDrafterConfig(
        vocab_size=target.config.vocab_size,
        target_hidden_size=target.config.hidden_size,
        feature_layers=[1, 2],
        horizon=horizon,
        context_window=4,
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        intermediate_size=64,
        target_num_layers=target.config.num_hidden_layers,
        conditioning=conditioning,
    )
    return tree_drafter_of(drafter_model_class(config).for_target(config, target).eval())


def tiny_vocab_drafter(target, draft_vocab: list[int], horizon: int = 4) -> BlockDrafter:
    """A random block drafter over a draft vocabulary ``draft_vocab`` of ``target``'s tokens."""
    config = BlockDrafterConfig(
        vocab_size=target.config.vocab_size, target_hidden_size=target.config.hidden_size, feature_layers=[1, 2], horizon=horizon,
        context_window=4, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
        target_num_layers=target.config.num_hidden_layers, draft_vocab_size=len(draft_vocab),
    )
    torch.manual_seed(0)
    drafter = BlockDrafter.for_target(config, target).eval()
    drafter.set_draft_vocab(torch.tensor(draft_vocab))
    return drafter


def tiny_ar_drafter(vocab_size: int, context: int = 96, seed: int = 2, horizon: int = 4) -> ARTreeDrafter:
    return ARTreeDrafter(tiny_target(vocab_size, arch="qwen3", context=context, seed=seed), horizon=horizon)


class OracleDrafter:
    """Test drafter that knows a reference continuation: it proposes that continuation as
    the first path plus a few decoy paths, so blocks are long and stops land mid-block."""

    name = "oracle"
    shape = "tree"
    feature_layers: tuple[int, ...] = ()

    def __init__(self, reference: list[int], prompt_length: int, vocab_size: int, depth: int = 6):
        self.reference = reference  # prompt + continuation
        self.prompt_length = prompt_length
        self.vocab_size = vocab_size
        self.depth = depth

    def new_state(self) -> DraftState:
        return DraftState()

    def marginals(self, context: DraftContext, state: DraftState) -> None:
        return None

    def propose(self, context: DraftContext, budget: int, state: DraftState, timer=None) -> DraftTree:
        position = len(context.token_ids)
        depth = min(self.depth, context.max_depth, budget)
        truth = self.reference[position : position + depth]
        decoys = [[(t + 1) % self.vocab_size] for t in truth[:1]]
        paths = [truth] + decoys if budget > len(truth) else [truth]
        return DraftTree.from_paths(context.token_ids[-1], paths)


def save_pair(folder: Path, vocab_size: int = 300):
    """Save a tiny target (with tokenizer), a block drafter, an AR drafter and a mismatched
    AR drafter under ``folder``; returns their paths."""
    tokenizer = tiny_tokenizer(vocab_size)
    target = tiny_target(len(tokenizer), eos_token_id=tokenizer.eos_token_id)
    paths = {name: folder / name for name in ("target", "block", "ar", "other_ar")}
    target.save_pretrained(paths["target"])
    tokenizer.save_pretrained(paths["target"])
    tiny_block_drafter(target).model.save_pretrained(paths["block"])
    ar = tiny_ar_drafter(len(tokenizer))
    ar.model.save_pretrained(paths["ar"])
    tokenizer.save_pretrained(paths["ar"])
    other_tokenizer = tiny_tokenizer(vocab_size, seed_text="while True:\n    x = y * z\n")
    other = tiny_target(len(other_tokenizer), arch="qwen3", seed=3)
    other.save_pretrained(paths["other_ar"])
    other_tokenizer.save_pretrained(paths["other_ar"])
    return paths


CHAT_WORDS = "the a is of to and in it you what how write code python function number sum two three four five add list why sky blue".split()
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def tiny_chat_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer of a few dozen words with ChatML special tokens and template, so a
    random tiny model ends its turns (``<|im_end|>``) often enough for chat-data tests."""
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "[UNK]"]
    vocab = {token: index for index, token in enumerate(special + CHAT_WORDS + ["user", "assistant", "system"])}
    words = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    words.decoder = decoders.WordPiece()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=words, bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|im_end|>", unk_token="[UNK]",
        additional_special_tokens=["<|endoftext|>"], clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHATML
    return tokenizer


def save_chat_target(folder: Path) -> Path:
    """A tiny random chat model (Llama, ChatML template) with its tokenizer, saved in ``folder``."""
    tokenizer = tiny_chat_tokenizer()
    target = tiny_target(len(tokenizer), context=256, eos_token_id=tokenizer.eos_token_id, scale=0.2)
    target.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
