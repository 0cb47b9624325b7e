"""MPI groups: an ordered set of the job's ranks (world ranks), as
mpi4py's Group.  A group is local: making or comparing one talks to no one."""
from .errors import ERR_GROUP, ERR_RANK, MPIError
from .request import UNDEFINED

IDENT, CONGRUENT, SIMILAR, UNEQUAL = 0, 1, 2, 3     # MPICH's numbers, as mpi4py's MPI.IDENT ...


class Group:
    """members: world ranks in this group's rank order; me: this process's
    world rank (None: a group made outside a job, as GROUP_EMPTY)."""

    def __init__(self, members=(), me=None):
        self._members = tuple(int(m) for m in members)
        if len(set(self._members)) != len(self._members):
            raise MPIError(ERR_RANK, f"a group holds each rank once, not {list(self._members)}")
        self._me = me
        self._freed = False

    @property
    def members(self):
        if self._freed:
            raise MPIError(ERR_GROUP, "the group was freed")
        return self._members

    def Get_size(self):
        return len(self.members)

    def Get_rank(self):
        """This process's rank in the group, UNDEFINED if not a member."""
        return self.members.index(self._me) if self._me in self.members else UNDEFINED

    size = property(Get_size)
    rank = property(Get_rank)

    def _ranks(self, ranks, what):
        out = [int(r) for r in ranks]
        bad = [r for r in out if not 0 <= r < len(self.members)]
        if bad:
            raise MPIError(ERR_RANK, f"{what}: ranks {bad} are not ranks of a group of {len(self.members)}")
        if len(set(out)) != len(out):
            raise MPIError(ERR_RANK, f"{what}: ranks {out} repeat a rank")
        return out

    def Incl(self, ranks):
        return Group([self.members[r] for r in self._ranks(ranks, "Incl")], self._me)

    def Excl(self, ranks):
        gone = set(self._ranks(ranks, "Excl"))
        return Group([m for r, m in enumerate(self.members) if r not in gone], self._me)

    def _range(self, ranges, what):
        out = []
        for first, last, stride in ranges:
            if stride == 0 or (last - first) * stride < 0:
                raise MPIError(ERR_RANK, f"{what}: the range ({first}, {last}, {stride}) is empty or endless")
            out += range(first, last + (1 if stride > 0 else -1), stride)
        return out

    def Range_incl(self, ranges):
        return self.Incl(self._range(ranges, "Range_incl"))

    def Range_excl(self, ranges):
        return self.Excl(self._range(ranges, "Range_excl"))

    def Translate_ranks(self, ranks=None, group=None):
        """Each rank of this group as a rank of group (UNDEFINED: not in it;
        PROC_NULL stays); ranks None: all of them; group None: the ranks
        themselves where they are valid (mpi4py's default)."""
        from .request import PROC_NULL
        ranks = range(len(self.members)) if ranks is None else [int(r) for r in ranks]
        other = group.members if group is not None else self.members
        out = []
        for r in ranks:
            if r == PROC_NULL:
                out.append(PROC_NULL)
                continue
            self._ranks([r], "Translate_ranks")
            m = self.members[r]
            out.append(other.index(m) if m in other else UNDEFINED)
        return out

    def Compare(self, group):
        """IDENT (same ranks, same order), SIMILAR (same ranks), UNEQUAL."""
        if self.members == group.members:
            return IDENT
        return SIMILAR if set(self.members) == set(group.members) else UNEQUAL

    @classmethod
    def Union(cls, group1, group2):
        """group1's ranks, then group2's not in group1 (MPI's order)."""
        return Group(group1.members + tuple(m for m in group2.members if m not in group1.members),
                     group1._me)

    @classmethod
    def Intersection(cls, group1, group2):
        return Group([m for m in group1.members if m in group2.members], group1._me)

    @classmethod
    def Difference(cls, group1, group2):
        return Group([m for m in group1.members if m not in group2.members], group1._me)

    def Dup(self):
        return Group(self.members, self._me)

    def Free(self):
        self._freed = True

    def __eq__(self, other):
        if not isinstance(other, Group):
            return NotImplemented
        return self._freed == other._freed and (self._freed or self._members == other._members)

    def __hash__(self):
        return hash(None if self._freed else self._members)

    def __bool__(self):
        return not self._freed

    def __repr__(self):
        return f"<shmcoll.Group {list(self._members)}>"


GROUP_EMPTY = Group()
GROUP_NULL = Group()
GROUP_NULL.Free()          # what a freed group equals
