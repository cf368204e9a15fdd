/* policy.c: the run's policies as data. What each sync mode allows (a table: a new mode is a row,
 * not a strcmp in the driver), and fp16 loss scaling's rule, PyTorch GradScaler's: a step whose
 * unscaled gradients are not finite is skipped (the same verdict on every rank: the sum of
 * squares is all-reduced) and a dynamic scale halves; after GROWTH_INTERVAL good steps in a row
 * it doubles; --max-skips skipped steps in a row stop the run. */
#include "driver.h"

#include <string.h>

static const sync_policy_t sync_policies[] = {
	/* name        replicas_agree  reshardable  checkpoints  evaluates */
	{"strict", 1, 1, 1, 1},
	{"local_sgd", 0, 0, 1, 1}, /* each replica holds its own state between averages */
	{"async", 0, 0, 0, 0},     /* gradients and versions are in flight at every step boundary */
};

static const sync_policy_t *find_policy(const char *mode)
{
	for (size_t i = 0; i < sizeof sync_policies / sizeof sync_policies[0]; i++)
		if (!strcmp(sync_policies[i].name, mode))
			return &sync_policies[i];
	return NULL;
}

const sync_policy_t *planrt_sync_policy_(const planrt_program_t *p)
{
	const char *mode = p->sync ? p->sync : "strict";
	const sync_policy_t *s = find_policy(mode);
	if (!s)
		planrt_fatal("internal error: program '%s' has sync mode '%s', which planrt does not know", p->plan, mode);
	return s;
}

int planrt_sync_reshardable_(const char *mode)
{
	const sync_policy_t *s = find_policy(mode ? mode : "strict");
	return s && s->reshardable; /* a mode this planrt does not know (a newer one's checkpoint): no */
}

enum { GROWTH_INTERVAL = 2000, DEFAULT_DYNAMIC_SCALE = 65536 };

void planrt_loss_scaler_init_(loss_scaler_t *s, const planrt_program_t *p, const options_t *o, json_t *resumed)
{
	memset(s, 0, sizeof *s);
	s->scaled = p->loss_scale != 0;
	s->dynamic = p->loss_scale < 0;
	s->max_skips = o->max_skips;
	s->scale = o->loss_scale_init > 0 ? o->loss_scale_init : p->loss_scale > 0 ? p->loss_scale : DEFAULT_DYNAMIC_SCALE;
	double scale = resumed ? json_number_value(json_object_get(resumed, "scale")) : 0;
	if (s->scaled && scale > 0) { /* a resumed run goes on with its scale, as GradScaler's state_dict does */
		s->scale = scale;
		s->good_steps = json_integer_value(json_object_get(resumed, "good_steps"));
		s->skips_in_row = json_integer_value(json_object_get(resumed, "skips_in_row"));
	}
	if (s->scaled && resumed)
		planrt_steps_skipped_ = json_integer_value(json_object_get(resumed, "skipped"));
}

double planrt_loss_scaler_scale_(const loss_scaler_t *s)
{
	return s->scaled ? s->scale : 1.0;
}

int planrt_loss_scaler_update_(loss_scaler_t *s, int skipped)
{
	if (!s->scaled)
		return 0;
	if (skipped) {
		planrt_steps_skipped_++;
		s->good_steps = 0;
		if (s->dynamic)
			s->scale /= 2;
		return ++s->skips_in_row >= s->max_skips;
	}
	s->skips_in_row = 0;
	if (s->dynamic && ++s->good_steps == GROWTH_INTERVAL) {
		s->scale *= 2;
		s->good_steps = 0;
	}
	return 0;
}

json_t *planrt_loss_scaler_state_(const loss_scaler_t *s)
{
	return json_pack("{s:f, s:I, s:I, s:I}", "scale", s->scale, "good_steps", (json_int_t)s->good_steps,
			 "skips_in_row", (json_int_t)s->skips_in_row, "skipped", (json_int_t)planrt_steps_skipped_);
}
