"""The simulator's model: what it predicts and how (the engine, the rings and their sharing, the network, failures,
the neighbours' fabrics)."""
