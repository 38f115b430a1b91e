"""Restricted unpickling, in one place: a pickle run on a small stack machine of ours into inert values, under a
``PicklePolicy`` that says what its reader accepts (the rank monitor's client frames, Flight Recorder dumps).

Not ``pickle.Unpickler``, even with an allow-list: it calls the classes it resolves and applies BUILD to
whatever is on its stack (one frame could rename a shared enum member inside the live monitor), and its cost
is the sender's to choose (dict keys that all hash alike: seconds of uninterruptible CPU). Here a global is a
``Global`` name, objects are fresh ``Record``s that BUILD sets once, dict keys and set members are checked
before any is hashed, only the policy's opcodes run, and opcodes, integer size, time and (where asked) depth
and value count are bounded. ``policy`` says what a reader accepts, ``machine`` runs a pickle, ``objects``
reads what no dump holds. Standard library only: the rank monitor starts in milliseconds.
"""
