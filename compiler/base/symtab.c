/* symtab.c: string-keyed hash tables for name lookup. Sema's bindings, a module's items and the
 * elaborator's scopes used to be searched linearly, so a model with 100,000 names took 42 s to
 * check; every lookup is now expected O(1). Open addressing with linear probing over a power-of-two
 * table kept at most 3/4 full; FNV-1a hashes. Tables live in the compilation's arena (a grown
 * table leaves its old slots there, at most the size of the final one) and are never freed on
 * their own. Keys are not copied: they must live as long as the table (arena strings do). */
#include "base/base.h"

#include <string.h>

typedef struct Slot {
	const char *key; /* NULL: empty */
	void *value;
	unsigned hash;
} Slot;

struct SymTab {
	Arena *a;
	Slot *slots;
	int cap, n;
};

static unsigned hash_name(const char *s)
{
	unsigned h = 2166136261u;
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 16777619u;
	return h;
}

SymTab *symtab_new(Arena *a)
{
	SymTab *t = arena_alloc(a, sizeof *t);
	t->a = a;
	t->cap = 16;
	t->slots = arena_alloc(a, sizeof(Slot) * (size_t)t->cap);
	return t;
}

static Slot *find_slot(const SymTab *t, const char *key, unsigned h)
{
	int mask = t->cap - 1;
	for (int i = (int)(h & (unsigned)mask);; i = (i + 1) & mask) {
		Slot *s = &t->slots[i];
		if (!s->key || (s->hash == h && !strcmp(s->key, key)))
			return s;
	}
}

void *symtab_get(const SymTab *t, const char *key)
{
	if (!t || !key)
		return NULL;
	Slot *s = find_slot(t, key, hash_name(key));
	return s->key ? s->value : NULL;
}

void symtab_put(SymTab *t, const char *key, void *value)
{
	internal_assert(key != NULL);
	if (4 * (t->n + 1) > 3 * t->cap) {
		Slot *old = t->slots;
		int oldcap = t->cap;
		if (t->cap > (1 << 29))
			ICE("symbol table of %d names", t->n);
		t->cap *= 2;
		t->slots = arena_alloc(t->a, sizeof(Slot) * (size_t)t->cap);
		for (int i = 0; i < oldcap; i++)
			if (old[i].key)
				*find_slot(t, old[i].key, old[i].hash) = old[i];
	}
	unsigned h = hash_name(key);
	Slot *s = find_slot(t, key, h);
	if (!s->key) {
		s->key = key;
		s->hash = h;
		t->n++;
	}
	s->value = value;
}
