/* planrt_tempfile.h: temporary files beside a target (tempfile.c). Internal to planrt. */
#ifndef PLANRT_TEMPFILE_H
#define PLANRT_TEMPFILE_H

/* the temporary file this rank is writing (NULL: none), removed if a signal ends the process */
void planrt_pending_tmp_(const char *path);
/* removes it (the cleanup planrt_main gives planrt_on_signal_) */
void planrt_remove_pending_tmp_(void);
/* rank 0, at start: removes target's temporary files whose process is gone (a killed save) */
void planrt_remove_stale_temps_(const char *target);

#endif
