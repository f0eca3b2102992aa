"""Numbers that bound what a request may ask, in a module without torch, so that the command line's defaults read
them where they are defined (``steerkit serve --help`` loads neither torch nor fastapi)."""

#: Above this many candidates per step, a sequence-level reward (one reward-model position per candidate,
#: every step) costs far more than the LM itself: the paper and steerkit's defaults use k = 20 (1.1–1.35× the
#: plain decode time), k = 50 is already past the point where larger k changes the steered text, and at
#: k = 200 each step scores ten times the default's candidates. ``steerkit.generate`` warns past it, and
#: ``steerkit serve`` refuses it (``--max-k-sequence``, this by default).
LARGE_K = 200
