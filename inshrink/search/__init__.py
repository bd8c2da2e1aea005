"""Per-checkpoint configuration search (the paper's section 5).

Given the state to compress and a quality callback (the caller's loss or accuracy on a few
held-out batches), :class:`Search` picks the most compressive configuration of the weights
whose quality stays within a relative ``epsilon`` of the uncompressed state:

* the first checkpoint gets the *guided search* over the configuration cube (bins, embedding
  bins, prune fraction, protect fraction), once per prune metric: quality is monotone along
  every axis, so a binary search along the cube's diagonal finds a feasible point, and only
  the sub-cubes that can hold a smaller feasible point are searched next, most promising
  first (branch and bound on an expected size);
* later checkpoints get the *neighbourhood search*: the previous choice and its neighbours one
  step towards more precision (never more aggressive), smallest expected size first, the first
  feasible one wins (with ``Search(predict=True)``: those whose quality drop, predicted from
  the drops measured on earlier checkpoints by :class:`~.predict.DropModel`, is within
  epsilon first); when none is feasible, the guided search over the cube above the previous
  choice.

Every evaluation compresses the searched tensors with the candidate configuration, decodes
them and calls the callback, so a chosen configuration is one whose *actual* encoding was
measured within ``epsilon`` (a callback with ``bounded``, :class:`~.space.BoundedQuality`,
may stop on a candidate once it is proven infeasible); a hard cap bounds the evaluations, and
when nothing feasible is found the weights are stored losslessly. Optimizer moments are not
seen by a model-quality callback: given their optimizer's hyperparameters (:class:`Moments`)
they get per checkpoint the cheapest configuration whose effect on the next updates stays
within the weights' own error (:mod:`.moments`), else the search space's fixed ones. All
weight tensors share a configuration's bins unless ``SearchSpace.per_tensor_bins`` spreads
them by curvature (:func:`~.allocation.allocation`). The decisions behind the rules are
recorded in ``docs/decisions.md``.

The package: :mod:`.space` (the cube, :class:`Choice`), :mod:`.allocation` (per-tensor bits),
:mod:`.roundtrip` (candidates encoded and decoded in memory), :mod:`.moments` (the
optimizer moments' configuration), :mod:`.evaluate` (candidate
evaluations under the search's :class:`~.evaluate.Settings`, expected sizes), :mod:`.predict`
(predicted quality drops), :mod:`.walk` (the guided and neighbourhood walks),
:mod:`.choose` (:class:`Search`) and :mod:`.stored` (the report in a checkpoint's metadata).
This face names what a caller uses; the other names are imported from their modules.
"""
from .._lazy import face
from .allocation import allocation  # the function: else the name is its module's
from .choose import Search, SearchResult
from .moments import Moments
from .space import BoundedQuality, Choice, Quality, SearchSpace
from .stored import SEARCH_KEY

# the walks' internals, once named here too: still resolved for old code, defined (and
# imported by the tests) in their modules
_INTERNALS = {
    **dict.fromkeys(["ALLOCATION_SAMPLE", "MAX_SHIFT_BITS", "Shifts", "shifted"], ".allocation"),
    "SEARCHED_ROLES": ".choose",
    **dict.fromkeys(["SAMPLE", "Evaluator"], ".evaluate"),
    "Point": ".space",
    **dict.fromkeys(["NEIGHBOURHOOD", "SIGNIFICANT", "guided", "neighbourhood"], ".walk"),
}
__getattr__, __dir__ = face(__name__, _INTERNALS)
__all__ = ["BoundedQuality", "Choice", "Moments", "Quality", "SEARCH_KEY", "Search", "SearchResult",
           "SearchSpace"]
