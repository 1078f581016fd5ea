// A library shaped like gperftools tcmalloc's sampled path, as a seed of the elf_file fuzz
// target (fuzz/corpus/elf_file/tcmalloc-sampled-path) and a case of the agent's resolve::tcmalloc
// tests: its exported functions under tcmalloc's names, a hidden list head that
// ReadStackTraces loads, malloc calling DLL_Prepend onto that head through the PLT, free
// calling DLL_Remove after testing the span's sampled mark (flags at 0x2b, bit 2). Built with
//   cc -Os -fPIC -shared -nostdlib -s -o tcmalloc-sampled-path tcmalloc-sampled-path.c
typedef unsigned long size_t;
struct Span { long start, length; struct Span *next, *prev; void *objects; char pad[3]; unsigned char flags; };
static struct Span sampled_head;
long sample_parameter __asm__("_ZN61FLAG__namespace_do_not_use_directly_use_DECLARE_int64_instead31FLAGS_tcmalloc_sample_parameterE") = 524288;
void DLL_Prepend(struct Span *list, struct Span *span) __asm__("_ZN8tcmalloc11DLL_PrependEPNS_4SpanES1_");
void DLL_Remove(struct Span *span) __asm__("_ZN8tcmalloc10DLL_RemoveEPNS_4SpanE");
int ReadStackTraces(int *n) __asm__("_ZN22TCMallocImplementation15ReadStackTracesEPi");
void DLL_Prepend(struct Span *list, struct Span *span) { span->next = list->next; list->next = span; }
void DLL_Remove(struct Span *span) { span->prev->next = span->next; }
int ReadStackTraces(int *n) { struct Span *s = &sampled_head; for (; s; s = s->next) ++*n; return *n; }
static struct Span spans[4];
void *malloc(size_t n) { struct Span *s = &spans[n & 3]; s->flags |= 4; DLL_Prepend(&sampled_head, s); return s; }
void free(void *p) { struct Span *s = p; if (s->flags & 4) { DLL_Remove(s); s->flags = 0; } }
