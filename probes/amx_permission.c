/* AMX permission probe, run as its own process.
 *
 * Linux (>= 5.16) keeps AMX tile data off until a process asks for it with
 * arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA). Every answer is printed,
 * errno included, so that nothing is silently ignored. With "--prove", and only
 * if permission was granted, it also executes ldtilecfg/tilezero/tilestored/
 * tilerelease under a SIGILL/SIGSEGV handler. The instructions are emitted as
 * bytes so this file needs no -mamx-* flag and no AMX-aware assembler.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_GET_XCOMP_SUPP 0x1021
#define ARCH_GET_XCOMP_PERM 0x1022
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

static void print_get(const char *name, int code) {
#ifdef SYS_arch_prctl
  unsigned long long bits = 0;
  errno = 0;
  long rc = syscall(SYS_arch_prctl, code, &bits);
  int err = rc ? errno : 0;
  printf("\"%s\": {\"rc\": %ld, \"errno\": %d, \"bits\": %llu}, ", name, rc, err,
         rc ? 0ULL : bits);
#else
  printf("\"%s\": null, ", name);
#endif
}

static sigjmp_buf recover;
static volatile sig_atomic_t caught;
static void on_signal(int sig) {
  caught = sig;
  siglongjmp(recover, 1);
}

/* Palette 1, tile 0 configured as 16 rows x 64 bytes. */
struct tile_config {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} __attribute__((aligned(64)));

static const char *prove(void) {
  static struct tile_config cfg;
  static uint8_t out[16 * 64] __attribute__((aligned(64)));
  memset(&cfg, 0, sizeof cfg);
  memset(out, 0xA5, sizeof out);
  cfg.palette = 1;
  cfg.colsb[0] = 64;
  cfg.rows[0] = 16;

  struct sigaction sa, old_ill, old_segv;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGILL, &sa, &old_ill);
  sigaction(SIGSEGV, &sa, &old_segv);
  const char *verdict;
  if (sigsetjmp(recover, 1) == 0) {
    void *cfg_p = &cfg, *out_p = out;
    long stride = 64;
    __asm__ volatile(
        ".byte 0xc4, 0xe2, 0x78, 0x49, 0x07\n\t" /* ldtilecfg (%rdi) */
        ".byte 0xc4, 0xe2, 0x7b, 0x49, 0xc0\n\t" /* tilezero %tmm0 */
        "mov %1, %%rdi\n\t"
        ".byte 0xc4, 0xe2, 0x7a, 0x4b, 0x04, 0x37\n\t" /* tilestored %tmm0, (%rdi,%rsi,1) */
        ".byte 0xc4, 0xe2, 0x78, 0x49, 0xc0\n\t"       /* tilerelease */
        : "+D"(cfg_p)
        : "r"(out_p), "S"(stride)
        : "memory");
    verdict = "ok";
    for (unsigned i = 0; i < sizeof out; ++i)
      if (out[i] != 0) {
        verdict = "wrong-result";
        break;
      }
  } else {
    verdict = caught == SIGILL ? "sigill" : "sigsegv";
  }
  sigaction(SIGILL, &old_ill, NULL);
  sigaction(SIGSEGV, &old_segv, NULL);
  return verdict;
}

int main(int argc, char **argv) {
  int want_proof = argc > 1 && strcmp(argv[1], "--prove") == 0;
  printf("{");
#if defined(__x86_64__) && defined(__linux__) && defined(SYS_arch_prctl)
  print_get("supported", ARCH_GET_XCOMP_SUPP);
  print_get("permitted_before", ARCH_GET_XCOMP_PERM);
  errno = 0;
  long rc = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA);
  int err = rc ? errno : 0;
  printf("\"request\": {\"rc\": %ld, \"errno\": %d}, ", rc, err);
  print_get("permitted_after", ARCH_GET_XCOMP_PERM);
  unsigned long long after = 0;
  int granted = syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &after) == 0 &&
                (after & (1ULL << XFEATURE_XTILEDATA));
  const char *execution = "not-attempted";
  if (want_proof && granted) execution = prove();
  printf("\"execution\": \"%s\", \"platform\": \"linux-x86_64\"}\n", execution);
#else
  (void)want_proof;
  printf("\"platform\": \"unsupported\"}\n");
#endif
  return 0;
}
