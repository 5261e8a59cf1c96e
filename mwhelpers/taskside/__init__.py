"""The worker side: the modules that run inside tasks or on other hosts, never in the kernel.

``_bootstrap.py`` is run by path as every task's start-up and loads ``wire.py``,
``tfdata.py``, ``kerasfix.py``, ``lazyplot.py``, ``jaxgloo.py`` and ``taskfacts.py`` beside it by
path; ``_forkserver.py`` is the warm-start server (``_bootstrap.py --zygote``); ``_agent.py`` is
sent to other hosts as ``python -c`` source, after ``wire.py``, the protocol both sides read, and
``agentwarm.py``, its warm starts.
None of them may import the ``mwhelpers`` package or a module outside
this folder (``tests/inprocess/test_layout.py`` checks): a task, or a host without mwhelpers installed,
runs them on the standard library alone.  The kernel side may import them, for their
constants (a variable's name, a line's format) and for the functions users call
(``mwhelpers.fix_keras_multi_worker``, ``mwhelpers.avoid_teardown_stall``).
"""
