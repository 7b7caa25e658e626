# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The acceptance gate's default smoke prompts.

Varied on purpose: acceptance length depends on the text (code and arithmetic are easier to draft than
free prose), so a drafter that only works on one kind cannot pass on the mix. Each prompt asks for a
long enough answer that `max_tokens` (not an early stop) ends most completions.
"""

from __future__ import annotations

from typing import Tuple

__all__ = ["DEFAULT_PROMPTS"]

DEFAULT_PROMPTS: Tuple[str, ...] = (
    # code
    "Write a Python function `merge_intervals(intervals)` that merges overlapping closed intervals given as "
    "a list of (start, end) tuples. Include a docstring and three doctest examples.\n\n```python\n",
    "Implement binary search over a sorted list of integers in C. Return the index of the target or -1, "
    "and explain the loop invariant in a comment.\n\n```c\n",
    "Write a Bash script that walks a directory tree, finds files larger than 100 MB and prints their size "
    "and path sorted by size, largest first.\n\n```bash\n",
    "Refactor this JavaScript into async/await and add error handling:\n\n"
    "function load(url, cb) { fetch(url).then(r => r.json()).then(d => cb(null, d)).catch(e => cb(e)); }\n\n",
    # math word problems
    "Question: A bakery sells muffins for $3 each and cookies for $1.50 each. On Monday it sold 48 muffins "
    "and twice as many cookies. How much money did it take in on Monday? Answer step by step.\nAnswer:",
    "Question: A train leaves at 9:40 and travels 210 km at an average speed of 84 km/h. At what time does "
    "it arrive? Show your reasoning.\nAnswer:",
    "Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May? Think step by step.\nAnswer:",
    "Question: A rectangle's length is 3 cm more than twice its width and its perimeter is 54 cm. Find its "
    "length, width and area, explaining each step.\nAnswer:",
    # prose
    "Explain to a new engineer how a write-ahead log makes a database crash-safe. Use two short paragraphs.",
    "Summarise the causes and consequences of the 1929 stock market crash for a high-school history class.",
    "Write a short story of about 150 words about a lighthouse keeper who finds a message in a bottle.",
    "Describe, in plain language, what speculative decoding is and why it can make text generation faster.",
)
