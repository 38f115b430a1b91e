"""Restricted unpickling, in one place: a pickle run on a small stack machine of ours into inert values, under a
``PicklePolicy`` that says what its reader accepts (the rank monitor's client frames, Flight Recorder dumps).

Why not ``pickle.Unpickler``, even with every global refused or an allow-list:
- it builds objects by calling the classes it resolves, and applies BUILD (``__setstate__`` or a
  ``__dict__``/``setattr`` update) to whatever is on its stack: one frame could rename a shared enum member
  or empty an allowed class's member map inside the live rank monitor;
- its cost is the sender's to choose: it builds dicts with any hashable key, and an int hashes to itself
  modulo 2**61-1 (a 260 KB pickle whose keys all hash alike took 2 s of CPU, 1 MB half a minute), in C,
  where nothing can interrupt it.
So here, in Python:
- a global becomes a ``Global`` name (only the policy's ``(module, name)`` pairs), never the real object;
  NEWOBJ / NEWOBJ_EX / REDUCE on one make a fresh ``Record`` (class name, arguments) and BUILD sets a record's
  state once; BUILD on anything else, a global included, is refused;
- containers are fresh Python containers; a dict key or a set member is one of the policy's plain types,
  checked before any is hashed (a dump's are strings: a str hash is keyed by a per-process secret);
- only the policy's opcodes: any other (persistent ids, extension codes, INST/OBJ, ...) ends the read, as
  does a pop past a MARK;
- the work is bounded: opcodes (each makes at most one object), integer size, a deadline, and where the
  policy asks, nesting depth and the number of values (a shared or cyclic value counts each time it is
  reached, so cycles hit the bound too).
``policy`` says what a reader accepts, ``machine`` runs a pickle (one loop, the opcodes of a dump first: a
dump holds up to two million of them), ``objects`` reads what no dump holds (globals, objects, sets, bytes,
protocol 0's text forms). Standard library only: the rank monitor reads frames with it and starts in
milliseconds.
"""
