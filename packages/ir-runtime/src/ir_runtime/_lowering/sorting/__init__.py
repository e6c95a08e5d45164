"""Sorting and selection: sort, topk, kthvalue, median, mode, cumulative max/min/product,
logcumsumexp, searchsorted, bucketize, histograms, segment_reduce.

Index outputs are torch CPU's, exactly. Where ties make the index (or the sign of a zero, or
with ``sorted=False`` the order itself) depend on the algorithm torch CPU runs --
``std::sort`` for ``sort(stable=False)`` and ``mode``, ``std::nth_element`` and
``std::partial_sort`` for ``topk``, torch's quickselect for ``kthvalue``, ``std::nth_element``
for ``median``/``nanmedian`` without a dim -- the rule checks for such ties at run time and
only then replays that algorithm step by step (``_Machine``: libstdc++'s introsort,
introselect and heap routines, on every row at once, in ``lax.while_loop``s). Without ties
the result is unique and comes from one stable ``lax.sort``. The replay costs compile time
(about a second per such op), and run time only when there are ties; ``stable=True`` and
dims of at most 16 (``std::sort`` is an insertion sort there) never need it.

Other conventions kept: NaN sorts above everything; cumulative ops accumulate as torch CPU
does (float32 in float64: at::acc_type); histogram bin edges are torch's linspace (from both
ends, with the FMA its compiler makes; float64 edges are faithful, correctly rounded but for
exact halfway cases), a histogram whose range torch would refuse (not finite: NaN or inf in
the data) is NaN; searchsorted and bucketize replay torch's binary search (its path decides
where a NaN or an unsorted sequence sends a value).

The family's modules: ``sort`` (sort, topk, kthvalue, median, nanmedian, mode), ``cumulative``
(cummax, cummin, cumprod, logcumsumexp), ``search`` (searchsorted, bucketize), ``histogram``
(histc, histogram, histogramdd), ``segment`` (segment_reduce); ``_machine`` replays torch's
algorithms, ``_common`` holds the keys and row helpers they share.
"""

from ir_runtime._lowering.sorting import (  # noqa: F401  (importing registers the rules)
    cumulative,
    histogram,
    search,
    segment,
    sort,
)
