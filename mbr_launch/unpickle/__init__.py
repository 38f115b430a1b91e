"""Restricted unpickling, in one place: a pickle run on a small stack machine of ours into inert values, under a
``PicklePolicy`` that says what its reader accepts (the rank monitor's client frames, Flight Recorder dumps).

Not ``pickle.Unpickler``, even with an allow-list: it calls the classes it resolves, applies BUILD to whatever is
on its stack, and its cost is the sender's to choose (dict keys that all hash alike). Here globals are names,
objects fresh ``Record``s, keys checked before any is hashed, and opcodes, integer size, time and (where asked)
depth and value count bounded. Standard library only: the rank monitor starts in milliseconds.
"""
