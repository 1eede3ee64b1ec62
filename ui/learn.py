"""The Learn tab's text: the quantities the other tabs show, in the paper's notation, with the
Walkthrough tab's first round as a worked example, and the practitioners' material under its own
heading."""

import html
import re

import gradio as gr

from ui.shared import FORMULAS
from visual.style import token_label

# The Walkthrough tab's opening round on the default pair (its first prompt, the tab's opening
# settings), as traced by tev.engine.walkthrough.trace_round through transformers' float32 forward (the drafter's head in int8);
# tests/test_learn.py traces it again and checks these numbers.
WORKED_ROUND = {
    "prompt": "Write a Python function that checks whether a string is a palindrome.",
    "drafter": "path", "verifier": "tev", "budget": 16, "temperature": 0.7, "top_p": 0.9, "seed": 0,
    "first": "```", "first_reach": 0.811, "other": "Here", "other_reach": 0.189,  # the root's two children the target can draw
    "other_child": "'s", "other_child_reach": 0.116,  # the one drafted child under "Here" the target can draw
    "chain": ("```", "python", "\n", "def", " is", "_", "pal", "ind"),  # the first guess and the path under it, each edge below it 1.00
    "coverage": 6.796, "exit": "ind", "exit_depth": 8, "bonus": "rome", "block_length": 9,
}


def _code(text: str) -> str:
    """A token as inline code, its whitespace made visible as on the page's figures; fenced by more
    backticks than any run inside it, so a token like ``` stays code."""
    shown = html.unescape(token_label(0, lambda _: text, None))
    longest = max((len(run) for run in re.findall("`+", shown)), default=0)
    fence = "`" * (longest + 1)
    return f"{fence} {shown} {fence}" if longest else f"`{shown}`"


def _worked_example(r: dict) -> str:
    """The worked example's paragraph, every number from ``r`` (:data:`WORKED_ROUND`)."""
    chain = ", ".join(_code(token) for token in r["chain"][1:])
    accepted = r["block_length"] - 1
    other, child = _code(r["other"]), _code(r["other_child"])
    missing = 1 - r["other_child_reach"] / r["other_reach"]  # rho at the other guess
    return (
        f"**A worked example: the Walkthrough tab's first round.** On the default pair, with the tab's opening prompt "
        f"(*{r['prompt']}*), $T = {r['temperature']}$, top-p ${r['top_p']}$, $B = {r['budget']}$, the {r['drafter']} drafter and seed {r['seed']}, "
        f"the root is the newline that opens the answer. There the target draws the drafter's first guess {_code(r['first'])} with "
        f"probability {r['first_reach']:.3f} and {other} with {r['other_reach']:.3f}; below {_code(r['first'])} it is sure of {chain} "
        f"(each edge 1.00), and below {other} it draws the drafted {child} with probability {r['other_child_reach'] / r['other_reach']:.2f}. "
        f"So the reach is $P$ = {r['first_reach']:.3f} at each of those {len(r['chain'])} nodes, {r['other_reach']:.3f} at {other} and "
        f"{r['other_child_reach']:.3f} at {child}; top-p gives the other {r['budget'] - len(r['chain']) - 2} nodes 0. Coverage: "
        f"$C = {len(r['chain'])} \\times {r['first_reach']:.3f} + {r['other_reach']:.3f} + {r['other_child_reach']:.3f} \\approx$ "
        f"**{r['coverage']:.3f}**, so TEV expects $1 + C$ = **{1 + r['coverage']:.3f}** tokens from this round. The walk leaves the tree "
        f"at one of three nodes: at {_code(r['exit'])} (depth {r['exit_depth']}, the chain's end) with $w$ = {r['first_reach']:.3f}, at "
        f"{child} with $w$ = {r['other_child_reach']:.3f}, or at {other} itself with $w = P \\rho$ = {r['other_reach']:.3f} $\\times$ "
        f"{missing:.2f} = {r['other_reach'] - r['other_child_reach']:.3f}, where $\\rho$ = {missing:.2f} is {other}'s missing mass: the share of "
        f"the target's next-token mass there that no drafted child holds. Every other node's $w$ is 0, and the three sum to 1. TEV drew the exit node {_code(r['exit'])}, "
        f"so the round kept {accepted} draft tokens plus the bonus {_code(r['bonus'])}: $L$ = **{r['block_length']}**, "
        f"{'more' if r['block_length'] > 1 + r['coverage'] else 'less'} than $1 + C$: one round's $L$ is a single draw, and may exceed "
        f"the bound on the expected length. (Traced in float32 through transformers' forward, the drafter reading its head in int8 as the "
        f"page does on a CPU; a forward that rounds otherwise can move the third decimal, or a near-tie in the tree.) *Walkthrough: press Run one round and follow steps 5 to 8.*"
    )


LEARN = r"""
### Speculative decoding with a draft tree

A small **draft model `q`** proposes a tree of possible next tokens; the **target model `p`** scores every node of
the tree in **one** forward pass (tree attention); a **verifier** keeps a path of the tree and adds one **bonus token**
drawn from the target. The output is distributed exactly as if the target had generated it alone.
*Walkthrough tab: one round, step by step, on the live model.*

**Notation.** A tree has a root $r$ (the last committed token) and $B$ other nodes; node $v$ carries a token $x_v$ at
depth $d(v)$ (the root has depth 0), its **parent** is $\mathrm{pa}(v)$ and its **children** are $\mathrm{Ch}(v)$. $p_v$ is the
target's next-token law after the path root $\to v$ (one row of the tree forward), $q_d$ the drafter's guess at depth $d$.
*Walkthrough: steps 2-4.*

**Reach.** Picture the target writing on its own from the root: at each node it samples its next token, and when that
token is one of the node's children it walks on to that child. The reach of $v$ is the chance this walk arrives at $v$:
$P(r) = 1$, $P(v) = P(\mathrm{pa}(v))\, p_{\mathrm{pa}(v)}(x_v)$. *Live tab: node colour. Walkthrough: step 5.*

**Coverage.** Every node the walk arrives at is a draft token the round keeps, so the number of draft tokens kept,
on average, is the sum of the reaches: that sum is the tree's **coverage**, $C(T) = \sum_{v \ne r} P(v)$. A round also
adds one bonus token, so $1 + C(T)$ bounds the expected **block length** (the tokens a round emits): every exact
verifier has $E[L] \le 1 + C(T)$, and TEV attains it. One round's $L$ is a single draw and may exceed it.
*Live tab: the timeline plots each round's $L$ against $1 + C$.*

**The exit node.** The walk leaves the tree exactly once: at the node where the target's next token is none of the
node's children (or the node is a leaf, with no children at all). That node is the **exit node**, and the chance of
leaving at $v$ is the **exit law** (the missing mass at $v$): $\rho(v) = 1 - \sum_{u \in \mathrm{Ch}(v)} p_v(x_u)$ and
$w(v) = P(v)\,\rho(v)$. The $w(v)$ sum to 1. Adding a child with token $a$ under $v$ raises coverage by $P(v)\,p_v(a)$.
*Live tab: node size; mass-by-depth chart. Walkthrough: steps 5 and 6.*

WORKED_EXAMPLE

**Sampling settings.** $p_v$ is the law the target samples from: its logits divided by the temperature $T$, then
truncated by top-k (keep the $k$ likeliest tokens), top-p (keep the likeliest tokens until their mass reaches $p$) and
min-p, in the order Hugging Face `generate` applies them, and renormalised. Every verifier is exact for that law,
whatever it is. At $T = 0$ the law is a point mass on the argmax: every reach is 0 or 1 and the tree shows no gradation;
pure sampling at $T = 1$ from a 135M model writes word salad. The page opens at $T = 0.7$, top-p $0.9$: sense, and graded reach.

**tau.** $\tau$ = tokens the answer got per target forward. A round's **output block** is its accepted draft tokens
plus the one bonus token; the **mean block length** $L$ over a run's rounds is what $1 + C$ bounds, and $\tau$ equals it
except where a stop (the end of the answer, a stop string, the length limit) cuts a block: the tokens past it count in
the block, not in $\tau$. *Live tab: stats line and timeline.*

**TEV (Tree Exit Verification).** Draw the exit node $V \sim w$ in one step, then the bonus $Y$ from the residual
$p_V^{\mathrm{res}}(a) \propto p_V(a)\,[a \notin \mathrm{Ch}(V)]$. It attains the bound, needs only the parent rows normalised, and one
host sync. Predraw-and-follow and sequential residual verification reach the same law by other routes.
*Verifier lab: all three match $w(v)$ and $1 + C$ on one fixed tree. Walkthrough: steps 6 and 7.*

**Why the output is exact, in words.** Think of the target sampling its own next tokens while walking down the tree:
at each node it either picks one of the node's children (and walks on) or picks something else (and leaves). The
chance that it reaches $v$ and leaves there is exactly $w(v)$. TEV draws where it leaves ($V \sim w$) and then what
it picked instead, from $p_V$ with the children removed: together that is one draw of the target's own walk, so every
block of tokens comes out with the target's own probability. The drafter only decides *which* paths are offered; a bad
drafter makes blocks short, never wrong.

**What a round costs and what it gains.** A round has six stages, named the same in the page, the JSON and the
benchmarks: *draft* (the drafter's pass), *build* (the tree from its guesses), *forward* (the target's one forward over
the $B + 1$ tree tokens), *head* (the tree's rows through the output head, truncated to the sampling law, with their
normalisers), *verify* (the verifier's own choice of exit node and bonus token: milliseconds) and *commit* (the cache
keeps the accepted path). It gains $L$ tokens ($\tau$ on average); plain decoding gains one token per target forward.
On a GPU a forward over 17 tokens costs about as much as over one (the weights are read once either way), so the
speedup is close to $\tau$; on a small CPU a round can cost more steps than it yields tokens (see *For practitioners*),
and the Live tab says so with this run's numbers when it happens. *Live tab: the speed line; Walkthrough: step 8.*

**Budget auto: how big a tree this machine pays for.** Instead of a fixed $B$, each round can keep the best-first
prefix of the drafter's tree, its best $k$ nodes by path probability $q(v)$, that pays here. The $k$ kept nodes are
expected to add $c \sum_{i \le k} q(v_i)$ tokens, where $c$ scales the drafter's own estimate to the coverage the past
rounds realised, and cost the time of a forward over $k + 1$ tokens, measured on this machine when the server starts and
followed as the rounds run. A node is kept while its expected tokens pay for its extra time at the rate the rounds
before it achieved. Only the drafter and past rounds decide, never the round's own target rows, so every verifier
stays exact. On a GPU a bigger tree costs almost nothing and auto keeps the cap; on a small CPU it keeps a few nodes or
none. *Live tab: tick "budget auto"; the round browser and the budget figure show each round's choice.*

**ExitTrain.** Fine-tune the drafter on the trees inference actually builds:
$\mathcal{L} = \mathcal{L}_{tok} + \lambda\,\mathcal{L}_{exit}$ with
$\mathcal{L}_{exit} = -\sum_i \sum_{v \ne r} w_i(v) \log q_{\theta, d(v)}(x_v \mid c_i) / \sum_i (|V_i| - 1)$:
probability moves toward the nodes where target mass exits. Note what it cannot weight: the root's
own exit $w(r)$ (the target's first token is not among the root's children) has no draft token, so
$\mathcal{L}_{exit}$ leaves it to $\mathcal{L}_{tok}$. *ExitTrain tab: where the mass leaves the trees,
depth by depth, before and after.*

**Where a drafter gains.** Fine-tuned on the text it was already distilled on, a drafter has nothing left
to learn: the tab's domain mode shows no measurable change. Fine-tuned on a **workload it has not seen**
(the target's answers to your own prompts), it gains a lot where those answers share a format, and the
token loss does all of it: on the four shipped packs no tree term (the paper's $w(v)$, the official code's
floored reach or $w(v)\,d(v)$, or the target's law $p_v$ at every node as the label of the next depth)
beat the token-only control. A tree term reweights tokens the trees already hold; the answers themselves
are what the drafter had not seen. *ExitTrain tab: adapt the drafter to a workload.*

### For practitioners

**tau and other tools' acceptance figures.** The mean block length counts the bonus token. It is the same number as EAGLE's
"average acceptance length" and SGLang's `spec_accept_length` (both count the bonus token) and the DFlash/DDTree "acceptance length".
Without the bonus token, the mean accepted draft length is the mean block length $- 1$. An acceptance *rate* per drafted token (vLLM's
`draft_acceptance_rate`) divides that by the tokens drafted per round (the chain length, or $B$ for a tree), so it falls
as the tree grows while $\tau$ rises. The speedup over plain decoding is about $\tau$ divided by the cost of one round
relative to one plain forward (tree forward + drafter + verifier).

**The head's cost on a CPU.** On a 2-core CPU a 17-token forward costs noticeably more than a one-token one, and at any
temperature the head reads the whole 49,152-row output matrix once (greedy only needs each row's argmax, sampling each
row's normaliser too), so a round can cost more steps than it yields tokens. *Live tab: the speed line.*

**What a row costs, and why a tree's row is the row plain decoding computes.** On a GPU the rows of a tree cost
about one token's. On a CPU each row is arithmetic on a core; in bfloat16, on CPUs whose instructions multiply
bfloat16 (AMX, AVX512_BF16), a product of a few rows costs little more than one, so bigger trees pay. But a matrix
library sums a row's terms in an order it picks by the number of rows, and in bfloat16 two tokens often nearly tie:
a row rounded one way inside a tree and another way alone would make greedy speculation part from greedy decoding.
The target's **row-invariant forward** rules that out by construction: every product goes through one prepacked
kernel at 2 to 64 rows (checked row by row when the server starts), norms reduce each row alone, rotary angles come
from one table, and attention splits a row's keys at a place that depends on its own position only, so a row adds its
terms in the same order alone, in a tree, or in a long prompt. Which precision runs is measured when the server starts
(the header says which, and why, at the threads the server's runs get): the row-invariant precision whose tree is cheapest,
where its one-token step costs at most 25% more than transformers' and its 9-token tree less (float32 where bfloat16
is emulated, on AVX2-only CPUs: there, at two threads, its step cost 0.82-0.85x transformers' and a 9-token tree
0.60x; bfloat16 on an AVX512_BF16 EPYC, whose step cost 0.41x transformers' and a 9-token tree 0.32x, at 17 and 21 ms),
transformers' own float32 forward where none qualifies (its rows then agree with one-token steps to the last
bits only where no near-tie flips). The same kernels give a row the same bits at one thread and at two, so the server
gives visitors' rounds every core and drops to one fewer while another process holds a core without changing an
answer; a drafter whose trees move with the thread count (checked at start) runs at the lower count throughout. *Header:
the target's precision and threads; Live tab: the speed line's one-token steps and threads.*

**Calibration (budget auto).** A drafter's $q$ is not calibrated: the shipped block drafter's realised $C(T)$ runs about
1.2x its $\sum q$. Budget auto's $c$ is that ratio, realised coverage over the drafter's estimate, followed over the
past rounds of a browser session. *Live tab: the budget figure names each round's $c$.*
""".replace("WORKED_EXAMPLE", _worked_example(WORKED_ROUND))


def tab() -> None:
    """The Learn tab: the text, its formulas rendered."""
    gr.Markdown(LEARN, latex_delimiters=FORMULAS)
