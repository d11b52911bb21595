/* An AVX2-only CPU on an AVX-512 machine, for one process tree (LD_PRELOAD; scripts/run/avx2_only.py
   builds and loads it). cpuid is made to fault (arch_prctl ARCH_SET_CPUID, where the CPU and
   kernel offer CPUID faulting) and is answered with the AVX-512, AMX and AVX-VNNI bits cleared,
   so onnxruntime's MLAS, numpy and others that choose kernels by cpuid run their AVX2 code, as
   on the AVX2-only CPUs many App Service plans and CI machines have. /proc/cpuinfo still tells
   the truth. Another SIGSEGV handler a program installs is kept and called for real faults. */
#define _GNU_SOURCE
#include <signal.h>
#include <string.h>
#include <stdint.h>
#include <ucontext.h>
#include <unistd.h>
#include <dlfcn.h>
#include <sys/syscall.h>
#include <cpuid.h>

static struct sigaction chained;
static int (*real_sigaction)(int, const struct sigaction *, struct sigaction *);

static void set_cpuid(int on) { syscall(SYS_arch_prctl, 0x1012, on); }

static void handler(int sig, siginfo_t *si, void *ctx) {
  ucontext_t *uc = ctx;
  greg_t *g = uc->uc_mcontext.gregs;
  const unsigned char *ip = (const unsigned char *)g[REG_RIP];
  if (ip[0] == 0x0f && ip[1] == 0xa2) {
    unsigned a, b, c, d;
    unsigned leaf = (unsigned)g[REG_RAX], sub = (unsigned)g[REG_RCX];
    set_cpuid(1);
    __cpuid_count(leaf, sub, a, b, c, d);
    set_cpuid(0);
    if (leaf == 7 && sub == 0) {
      b &= ~((1u<<16)|(1u<<17)|(1u<<21)|(1u<<26)|(1u<<27)|(1u<<28)|(1u<<30)|(1u<<31));
      c &= ~((1u<<1)|(1u<<6)|(1u<<11)|(1u<<12)|(1u<<14));
      d &= ~((1u<<2)|(1u<<3)|(1u<<8)|(1u<<22)|(1u<<23)|(1u<<24)|(1u<<25));
    } else if (leaf == 7 && sub == 1) {
      a &= ~((1u<<4)|(1u<<5)|(1u<<23));
    } else if (leaf == 0xd && sub == 0) {
      a &= ~(0xe0u); /* opmask, ZMM_Hi256, Hi16_ZMM state not offered */
    }
    g[REG_RAX] = a; g[REG_RBX] = b; g[REG_RCX] = c; g[REG_RDX] = d;
    g[REG_RIP] += 2;
    return;
  }
  if (chained.sa_flags & SA_SIGINFO) { chained.sa_sigaction(sig, si, ctx); return; }
  if (chained.sa_handler == SIG_IGN) return;
  if (chained.sa_handler != SIG_DFL) { chained.sa_handler(sig); return; }
  struct sigaction dfl; memset(&dfl, 0, sizeof dfl); dfl.sa_handler = SIG_DFL;
  real_sigaction(SIGSEGV, &dfl, NULL);  /* the fault repeats and kills as it would have */
}

int sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
  if (!real_sigaction) real_sigaction = dlsym(RTLD_NEXT, "sigaction");
  if (sig != SIGSEGV) return real_sigaction(sig, act, old);
  if (old) *old = chained;
  if (act) chained = *act;
  return 0;
}

__attribute__((constructor)) static void init(void) {
  real_sigaction = dlsym(RTLD_NEXT, "sigaction");
  struct sigaction sa; memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = handler; sa.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  real_sigaction(SIGSEGV, &sa, NULL);
  chained.sa_handler = SIG_DFL;
  set_cpuid(0);
}
