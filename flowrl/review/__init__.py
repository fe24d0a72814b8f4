"""`flowrl review`: a local web page to read runs, compare a group and label them from the keyboard.

- `flowrl.review.queue`: which traces to review and in what order (filters, sorts, counters), and labelling;
- `flowrl.review.suggest`: the learned reward's suggestions, refits and how often they agreed with you;
- `flowrl.review.view`: one trace as what the page shows (turns, rewards, answer, tokens, cost);
- `flowrl.review.app`: the Starlette app (`create_app(store)`), its security headers, CSRF and token checks;
- `flowrl.review.routes`: the pages and the JSON endpoints.

Only `app` and `routes` import Starlette and Jinja2 (the `review` extra); the rest are plain library code.
Everything read from a trace is text: templates escape it, nothing of it is rendered as markup.
"""

from __future__ import annotations

MISSING_EXTRA = "flowrl review needs the review extra: pip install 'flowrl[review]'"

__all__ = ["MISSING_EXTRA"]
