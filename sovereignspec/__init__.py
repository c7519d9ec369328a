"""SovereignSpec: when does speculative decoding pay, for whom, and on which GPU.

`sovereignspec.core` holds the pure decision logic; everything else adapts it to the outside world.
"""

__version__ = "0.1.0"
