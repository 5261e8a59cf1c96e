"""The tutorials' pictures: the drawing code, kept out of the lesson cells.

One module per topic (``sharding``, ``collectives``, ...); each public function draws one
picture and returns its matplotlib ``Figure``, which the notebook shows. Functions that draw
what a run produced take that run's results as arguments; the others draw a fixed diagram.
Import a topic's module, for instance ``from mwhelpers.workshop.pictures import sharding``.

matplotlib is imported by the modules, not by ``mwhelpers``: it comes with the
``mwhelpers[tutorials]`` extra.
"""
