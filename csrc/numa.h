/* shmcoll NUMA shim: the cffi cdef (plain declarations only, parsed by cffi and included by numa.c).
   All functions return >= 0 on success and -errno on failure; with backend 0 (no kernel NUMA
   support, or the syscalls are blocked by seccomp) the placement calls return -ENOSYS. */
#define SC_NUMA_MASK_WORDS 16      /* node masks are unsigned long[16]: up to 1024 nodes */

int sc_numa_backend(void);             /* 0 none, 1 raw syscall(2), 2 libnuma.so.1 (dlopen'ed) */
int sc_numa_set_backend(int backend);  /* force 0/1/2 (tests); -ENOENT if that backend is unavailable */
int sc_numa_max_node(void);            /* highest node id with memory; 0 without NUMA */
int sc_numa_memory_nodes(unsigned long *mask, int nwords);  /* fill mask of nodes with memory; returns their count */

int sc_numa_bind(void *addr, size_t len, int node, int strict);  /* MPOL_BIND (strict) or MPOL_PREFERRED */
int sc_numa_interleave(void *addr, size_t len);                  /* MPOL_INTERLEAVE over all memory nodes */
int sc_numa_node_of(void *addr);                                 /* node of the page holding addr (faults it in) */
int sc_numa_policy_of(void *addr, int *mode, unsigned long *mask, int nwords);  /* policy governing addr */
int sc_numa_query_pages(void **pages, int n, int *status);       /* move_pages query: node or -errno per page */
