/* A stand-in for Windows' bcryptprimitives.dll, which Wine 8 lacks: Rust's
 * standard library (1.78 and later) imports ProcessPrng from it, and every
 * Rust program fails to start under Wine without it. Test machines only:
 * it forwards to BCryptGenRandom, which Wine has. */
#include <windows.h>
#include <bcrypt.h>

BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len)
{
    while (len > 0) {
        ULONG chunk = len > (1u << 30) ? (1u << 30) : (ULONG)len;
        if (BCryptGenRandom(NULL, data, chunk, BCRYPT_USE_SYSTEM_PREFERRED_RNG) != 0)
            return FALSE;
        data += chunk;
        len -= chunk;
    }
    return TRUE;
}
