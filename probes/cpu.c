/* CPU probe: raw CPUID leaves and XCR0, printed as JSON.
 *
 * Compiled without ISA flags and decoding nothing: every bit is interpreted in
 * Python (ktforge.cpuid), the same code that reads recorded CPUID dumps.
 * Output: {"leaves": [[leaf, subleaf, eax, ebx, ecx, edx], ...], "xcr0": N|null}
 */
#include <stdint.h>
#include <stdio.h>

#if !defined(__x86_64__) && !defined(__i386__)
int main(void) {
  printf("{\"error\": \"not an x86 CPU: CPUID does not exist here\"}\n");
  return 3;
}
#else
#include <cpuid.h>

static void leaf(unsigned int l, unsigned int sub, int *first) {
  unsigned int a = 0, b = 0, c = 0, d = 0;
  __cpuid_count(l, sub, a, b, c, d);
  printf("%s[%u, %u, %u, %u, %u, %u]", *first ? "" : ", ", l, sub, a, b, c, d);
  *first = 0;
}

int main(void) {
  unsigned int a, b, c, d;
  __cpuid(0, a, b, c, d);
  unsigned int max_basic = a;
  __cpuid(0x80000000u, a, b, c, d);
  unsigned int max_ext = a;

  static const unsigned int basic[][2] = {
      {0, 0}, {1, 0}, {7, 0}, {7, 1}, {0xD, 0}, {0xD, 1}, {0x1D, 0}, {0x1D, 1}, {0x1E, 0}};
  int first = 1;
  printf("{\"leaves\": [");
  for (unsigned int i = 0; i < sizeof basic / sizeof basic[0]; ++i)
    if (basic[i][0] <= max_basic) leaf(basic[i][0], basic[i][1], &first);
  for (unsigned int l = 0x80000000u; l <= 0x80000008u && l <= max_ext; ++l) leaf(l, 0, &first);
  /* Hypervisor vendor leaf; only meaningful when CPUID.1:ECX.hypervisor (bit 31) is set. */
  __cpuid(1, a, b, c, d);
  if (c & (1u << 31)) leaf(0x40000000u, 0, &first);
  printf("], ");

  /* xgetbv faults unless the OS has set CR4.OSXSAVE (CPUID.1:ECX bit 27). */
  if (c & (1u << 27)) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    printf("\"xcr0\": %llu}\n", ((unsigned long long)hi << 32) | lo);
  } else {
    printf("\"xcr0\": null}\n");
  }
  return 0;
}
#endif
