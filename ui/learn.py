"""The Learn tab's text: the quantities the other tabs show, in the paper's notation."""

import gradio as gr

from ui.shared import FORMULAS

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

**Reach.** With $p_v$ the target's next-token distribution at node $v$: $P(r) = 1$, $P(v) = P(\mathrm{pa}(v))\, p_{\mathrm{pa}(v)}(x_v)$,
the probability that plain sampling from $p$ walks to $v$. *Live tab: node colour. Walkthrough: step 5.*

**Exit law (missing mass).** $\rho(v) = 1 - \sum_{u \in \mathrm{Ch}(v)} p_v(x_u)$ and $w(v) = P(v)\,\rho(v)$: the target mass that
**leaves the tree at $v$**. The $w(v)$ sum to 1. Adding a child with token $a$ under $v$ raises coverage by $P(v)\,p_v(a)$. *Live tab: node size; mass-by-depth chart. Walkthrough: step 5.*

**Sampling settings.** $p_v$ is the law the target samples from: its logits divided by the temperature $T$, then
truncated by top-k (keep the $k$ likeliest tokens), top-p (keep the likeliest tokens until their mass reaches $p$) and
min-p, in the order Hugging Face `generate` applies them, and renormalised. Every verifier is exact for that law,
whatever it is. At $T = 0$ the law is a point mass on the argmax: every reach is 0 or 1 and the tree shows no gradation;
pure sampling at $T = 1$ from a 135M model writes word salad. The page opens at $T = 0.7$, top-p $0.9$: sense, and graded reach.

**Coverage bound.** $C(T) = \sum_{v \ne r} P(v)$. Every exact verifier has expected block length $E[L] \le 1 + C(T)$.
*Live tab: the timeline plots each round's $L$ against $1 + C$.*

**tau, and other tools' acceptance figures.** $\tau$ = tokens the answer got per target forward. A round's
**output block** is its accepted draft tokens plus the one bonus token; the **mean block length** is what $1 + C$ bounds, and
$\tau$ equals it except where a stop (the end of the answer, a stop string, the length limit) cuts a block: the tokens past it
count in the block, not in $\tau$. The mean block length is the same number as EAGLE's
"average acceptance length" and SGLang's `spec_accept_length` (both count the bonus token) and the DFlash/DDTree "acceptance length".
Without the bonus token, the mean accepted draft length is the mean block length $- 1$. An acceptance *rate* per drafted token (vLLM's
`draft_acceptance_rate`) divides that by the tokens drafted per round (the chain length, or $B$ for a tree), so it falls
as the tree grows while $\tau$ rises. The speedup over plain decoding is about $\tau$ divided by the cost of one round
relative to one plain forward (tree forward + drafter + verifier). *Live tab: stats line and timeline.*

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
speedup is close to $\tau$. On a 2-core CPU a 17-token forward costs noticeably more than a one-token one, and at any
temperature the head reads the whole 49,152-row output matrix once (greedy only needs each row's argmax, sampling each
row's normaliser too), so a round can cost more steps than it yields tokens: the Live tab says so with this run's
numbers when it happens. *Live tab: the speed line; Walkthrough: step 8.*

**Budget auto: how big a tree this machine pays for.** Instead of a fixed $B$, each round can keep the best-first
prefix of the drafter's tree, its best $k$ nodes by path probability $q(v)$, that pays here. The $k$ kept nodes are
expected to add $c \sum_{i \le k} q(v_i)$ tokens, where $c$ scales the drafter's own estimate to the realised coverage
$C(T)$ of the past rounds (a drafter's $q$ is not calibrated: the shipped block drafter's realised $C$ runs about 1.2x its
$\sum q$), and cost the time of a forward over $k + 1$ tokens, measured on this machine when the server starts and
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
"""


def tab() -> None:
    """The Learn tab: the text, its formulas rendered."""
    gr.Markdown(LEARN, latex_delimiters=FORMULAS)
