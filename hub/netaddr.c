/* The machine's LAN addresses (reach.h): what the self-signed certificate
 * names and where the hub tells people to point a browser when it listens
 * on every interface. */
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <string.h>

#include "hub/reach.h"

int hub_lan_ipv4(char (*out)[HUB_ADDR_LEN], int max) {
    struct ifaddrs *list;
    if (getifaddrs(&list)) return 0;
    int n = 0;
    for (const struct ifaddrs *i = list; i && n < max; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP) ||
            (i->ifa_flags & IFF_LOOPBACK))
            continue;
        const struct in_addr a = ((const struct sockaddr_in *)i->ifa_addr)->sin_addr;
        const uint32_t h = ntohl(a.s_addr);
        if ((h >> 24) == 127 || (h >> 16) == 0xA9FE) continue; /* loopback, link-local */
        char text[HUB_ADDR_LEN];
        if (!inet_ntop(AF_INET, &a, text, sizeof text)) continue;
        bool seen = false;
        for (int k = 0; k < n && !seen; k++) seen = !strcmp(out[k], text);
        if (!seen) memcpy(out[n++], text, sizeof text);
    }
    freeifaddrs(list);
    return n;
}
