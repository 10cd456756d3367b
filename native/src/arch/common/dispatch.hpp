// Turns runtime tile sizes into template instantiations: dispatch<MaxM, MaxNB, Tile>(m, nb, ...)
// calls Tile<m, nb>::run(...) for 1 <= m <= MaxM, 1 <= nb <= MaxNB.
#pragma once

namespace kt {

template <int MaxM, int MaxNB, template <int, int> class Tile, typename... Args>
void dispatch(int m, int nb, Args&&... args) {
  if constexpr (MaxM > 0) {
    if (m == MaxM) {
      if constexpr (MaxNB > 0) {
        if (nb == MaxNB) return Tile<MaxM, MaxNB>::run(args...);
        return dispatch<MaxM, MaxNB - 1, Tile>(m, nb, args...);
      }
      return;
    }
    return dispatch<MaxM - 1, MaxNB, Tile>(m, nb, args...);
  }
}

}  // namespace kt
